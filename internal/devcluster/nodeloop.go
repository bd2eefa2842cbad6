package devcluster

import (
	"context"

	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
)

// runNodeLoop serves queue (node names) with sync, in workers goroutines
// (the work queue never hands one node to two at once), until ctx ends,
// once the informers have synced: a node whose sync fails is retried with
// back-off (onError, if set, says why). The simulation loops (validation
// init containers, the device plugin) share it.
func runNodeLoop(ctx context.Context, queue workqueue.TypedRateLimitingInterface[string], synced []cache.InformerSynced,
	sync func(ctx context.Context, node string) error, onError func(node string, err error), workers int) {
	go func() {
		<-ctx.Done()
		queue.ShutDown()
	}()
	go func() {
		if !cache.WaitForCacheSync(ctx.Done(), synced...) {
			return
		}
		for range max(workers, 1) {
			go func() {
				for {
					node, quit := queue.Get()
					if quit {
						return
					}
					if err := sync(ctx, node); err != nil {
						if onError != nil {
							onError(node, err)
						}
						queue.AddRateLimited(node)
					} else {
						queue.Forget(node)
					}
					queue.Done(node)
				}
			}()
		}
	}()
}
