package devtest

import (
	"context"
	"sync"
	"testing"
	"time"
)

// CheckWhile runs check every 50 ms while a test acts, until the returned
// stop is called; stop reports each violation check returned (a non-empty
// string) as a test error. A check that cannot read what it checks returns
// "" and is tried again.
func CheckWhile(tb testing.TB, check func(ctx context.Context) string) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var (
		mu         sync.Mutex
		violations []string
		done       = make(chan struct{})
	)
	go func() {
		defer close(done)
		for {
			select {
			case <-ctx.Done():
				return
			case <-time.After(50 * time.Millisecond):
			}
			if v := check(ctx); v != "" {
				mu.Lock()
				violations = append(violations, v)
				mu.Unlock()
			}
		}
	}()
	return func() {
		tb.Helper()
		cancel()
		<-done
		for _, v := range violations {
			tb.Error(v)
		}
	}
}
