// informer: the watch-based peer of the fleet benchmark (bench --only apiserver-fleet). A
// client-go SharedInformer on ConfigMaps with a label selector, as controllers, Reloader
// and prometheus-config-reloader's Kubernetes watchers run one: a LIST, then a WATCH from
// its resourceVersion, relisting when the watch ends, resyncing never. It writes nothing;
// it prints "synced" once its cache has synced, then "added|updated|deleted NS/NAME" per
// event, so the benchmark can time a change's arrival.
package main

import (
	"bufio"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
)

func main() {
	kubeconfig := flag.String("kubeconfig", os.Getenv("KUBECONFIG"), "kubeconfig file")
	selector := flag.String("selector", "cmpoll.io/module=true", "label selector")
	flag.Parse()
	config, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		fmt.Fprintln(os.Stderr, "informer:", err)
		os.Exit(2)
	}
	client := kubernetes.NewForConfigOrDie(config)
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = *selector }))
	informer := factory.Core().V1().ConfigMaps().Informer()
	out := bufio.NewWriter(os.Stdout)
	lines := make(chan string, 1024)
	say := func(what string, obj interface{}) {
		if cm, ok := obj.(*corev1.ConfigMap); ok {
			lines <- what + " " + cm.Namespace + "/" + cm.Name
		}
	}
	_, _ = informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj interface{}) { say("added", obj) },
		UpdateFunc: func(_, obj interface{}) { say("updated", obj) },
		DeleteFunc: func(obj interface{}) { say("deleted", obj) },
	})
	stop := make(chan struct{})
	factory.Start(stop)
	go func() {
		if cache.WaitForCacheSync(stop, informer.HasSynced) {
			lines <- "synced"
		}
	}()
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)
	for {
		select {
		case l := <-lines:
			fmt.Fprintln(out, l)
			out.Flush()
		case <-signals:
			close(stop)
			return
		}
	}
}
