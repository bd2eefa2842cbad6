package devtest

import (
	"context"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// WaitFor polls cond every 100 ms until it reports done, for at most
// timeout (and never past the test's end). Otherwise it runs onTimeout
// (e.g. to log the cluster's objects while they still exist) and fails tb
// with what and the state cond last reported. A cond that cannot read what
// it waits for returns false and says so in its state; it is tried again.
func WaitFor(tb testing.TB, what string, timeout time.Duration, cond func(ctx context.Context) (done bool, state string), onTimeout ...func()) {
	tb.Helper()
	last := "(not checked)"
	err := wait.PollUntilContextTimeout(tb.Context(), 100*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		done, state := cond(ctx)
		last = state
		return done, nil
	})
	if err == nil {
		return
	}
	for _, f := range onTimeout {
		f()
	}
	tb.Fatalf("waiting for %s: not within %s (%v); last state: %s", what, timeout, err, last)
}
