package testobj

import (
	"context"
	"fmt"
	"sync"

	"sigs.k8s.io/controller-runtime/pkg/client"
)

// ListCopies is a client that counts, by list type, the lists that ask the
// cache for copies (without client.UnsafeDisableDeepCopy): the passes that
// read every node or object of the cluster must not copy them.
type ListCopies struct {
	client.Client

	mu      sync.Mutex
	copying map[string]int
}

// List counts a copying list, then lists.
func (c *ListCopies) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	o := &client.ListOptions{}
	o.ApplyOptions(opts)
	if o.UnsafeDisableDeepCopy == nil || !*o.UnsafeDisableDeepCopy {
		c.mu.Lock()
		if c.copying == nil {
			c.copying = map[string]int{}
		}
		c.copying[fmt.Sprintf("%T", list)]++
		c.mu.Unlock()
	}
	return c.Client.List(ctx, list, opts...)
}

// Copying returns the copying lists so far, by list type ("*v1.NodeList"),
// and forgets them.
func (c *ListCopies) Copying() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := c.copying
	c.copying = nil
	return out
}
