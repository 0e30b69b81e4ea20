// shortwatch: a candidate for how cmpoll could poll (issue 31, item 3), measured in the
// fleet benchmark before anything is built into cmpoll. A poll asks only for what changed
// since the last one: a WATCH from the last resourceVersion with a short timeoutSeconds,
// answered from the apiserver's watch cache and closed by the apiserver after it, so no
// connection is held between polls. It starts with a LIST (the resourceVersion), relists
// when the watch answers 410 Gone (the resourceVersion left the watch cache's window) or
// fails, and sleeps the rest of the interval (spread by up to --jitter of it, as cmpoll's
// --jitter). It writes nothing; it prints "synced" after the first list and
// "added|updated|deleted NS/NAME" per event, as the informer does, so the benchmark can
// time a change's arrival.
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/signal"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

func main() {
	kubeconfig := flag.String("kubeconfig", os.Getenv("KUBECONFIG"), "kubeconfig file")
	selector := flag.String("selector", "cmpoll.io/module=true", "label selector")
	interval := flag.Duration("interval", 30*time.Second, "time between polls")
	jitter := flag.Float64("jitter", 0.1, "spread each wait by up to this fraction of the interval")
	timeout := flag.Int64("watch-timeout", 1, "timeoutSeconds of each poll's watch")
	flag.Parse()
	config, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		fmt.Fprintln(os.Stderr, "shortwatch:", err)
		os.Exit(2)
	}
	client := kubernetes.NewForConfigOrDie(config)
	cms := client.CoreV1().ConfigMaps("")
	out := bufio.NewWriter(os.Stdout)
	say := func(line string) { fmt.Fprintln(out, line); out.Flush() }
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer cancel()

	rv := ""
	synced := false
	for ctx.Err() == nil {
		started := time.Now()
		if rv == "" {
			// A full list from the watch cache, as cmpoll's first poll.
			list, err := cms.List(ctx, metav1.ListOptions{LabelSelector: *selector, ResourceVersion: "0"})
			if err != nil {
				fmt.Fprintln(os.Stderr, "shortwatch: list:", err)
			} else {
				rv = list.ResourceVersion
				if !synced {
					synced = true
					say("synced")
				}
			}
		} else {
			rv = poll(ctx, cms.Watch, *selector, rv, *timeout, say)
		}
		wait := *interval
		if *jitter > 0 {
			wait += time.Duration((rand.Float64()*2 - 1) * *jitter * float64(*interval))
		}
		select {
		case <-ctx.Done():
		case <-time.After(wait - time.Since(started)):
		}
	}
}

type watcher func(context.Context, metav1.ListOptions) (watch.Interface, error)

// poll watches from rv for timeout seconds; the resourceVersion to go on from ("" to
// relist).
func poll(ctx context.Context, w watcher, selector, rv string, timeout int64, say func(string)) string {
	wi, err := w(ctx, metav1.ListOptions{
		LabelSelector:       selector,
		ResourceVersion:     rv,
		TimeoutSeconds:      &timeout,
		AllowWatchBookmarks: true,
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "shortwatch: watch:", err)
		if apierrors.IsResourceExpired(err) || apierrors.IsGone(err) {
			return ""
		}
		return rv
	}
	defer wi.Stop()
	for e := range wi.ResultChan() {
		switch e.Type {
		case watch.Error:
			status := apierrors.FromObject(e.Object)
			if apierrors.IsResourceExpired(status) || apierrors.IsGone(status) {
				return ""
			}
			fmt.Fprintln(os.Stderr, "shortwatch: watch error:", status)
			return rv
		case watch.Bookmark:
			if m, err := metaOf(e.Object); err == nil {
				rv = m.GetResourceVersion()
			}
		case watch.Added, watch.Modified, watch.Deleted:
			cm, ok := e.Object.(*corev1.ConfigMap)
			if !ok {
				continue
			}
			rv = cm.ResourceVersion
			what := map[watch.EventType]string{watch.Added: "added", watch.Modified: "updated", watch.Deleted: "deleted"}[e.Type]
			say(what + " " + cm.Namespace + "/" + cm.Name)
		}
	}
	return rv
}

func metaOf(obj interface{}) (metav1.Object, error) {
	if o, ok := obj.(metav1.Object); ok {
		return o, nil
	}
	return nil, fmt.Errorf("%T has no metadata", obj)
}
