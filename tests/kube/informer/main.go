// informer: the watch-based peer of the fleet benchmark (bench --only apiserver-fleet). A
// client-go SharedInformer on ConfigMaps with a label selector, as controllers, Reloader
// and prometheus-config-reloader's Kubernetes watchers run one: a LIST, then a WATCH from
// its resourceVersion, relisting when the watch ends, resyncing never. It writes nothing;
// it prints "synced" once its cache has synced, then "added|updated|deleted NS/NAME" per
// event, so the benchmark can time a change's arrival. On SIGUSR1 it prints its store,
// "store NS/NAME RV DATA" a line (DATA the JSON of its data), then "end", so a test can
// hold it against the selection (tests/real/clients.rs).
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"sort"
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
	namespace := flag.String("namespace", "", "one namespace (default: all)")
	flag.Parse()
	config, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		fmt.Fprintln(os.Stderr, "informer:", err)
		os.Exit(2)
	}
	client := kubernetes.NewForConfigOrDie(config)
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0,
		informers.WithNamespace(*namespace),
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
	dump := make(chan os.Signal, 1)
	signal.Notify(dump, syscall.SIGUSR1)
	for {
		select {
		case l := <-lines:
			fmt.Fprintln(out, l)
			out.Flush()
		case <-dump:
			var keys []string
			objects := map[string]*corev1.ConfigMap{}
			for _, o := range informer.GetStore().List() {
				if cm, ok := o.(*corev1.ConfigMap); ok {
					k := cm.Namespace + "/" + cm.Name
					keys = append(keys, k)
					objects[k] = cm
				}
			}
			sort.Strings(keys)
			for _, k := range keys {
				data, _ := json.Marshal(objects[k].Data)
				fmt.Fprintln(out, "store", k, objects[k].ResourceVersion, string(data))
			}
			fmt.Fprintln(out, "end")
			out.Flush()
		case <-signals:
			close(stop)
			return
		}
	}
}
