package devtest

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"
)

// fatalTB records a Fatalf and ends the goroutine, as testing.T does.
type fatalTB struct {
	testing.TB
	fatal string
}

func (f *fatalTB) Helper() {}

func (f *fatalTB) Fatalf(format string, args ...any) {
	f.fatal = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// waitFor runs WaitFor on a recording TB in its own goroutine (a Fatalf
// ends it) and returns the failure, "" when it returned.
func waitFor(t *testing.T, timeout time.Duration, cond func(context.Context) (bool, string), onTimeout ...func()) string {
	tb := &fatalTB{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		WaitFor(tb, "the thing", timeout, cond, onTimeout...)
	}()
	<-done
	return tb.fatal
}

func TestWaitFor(t *testing.T) {
	t.Run("done", func(t *testing.T) {
		calls := 0
		fatal := waitFor(t, 5*time.Second, func(context.Context) (bool, string) {
			calls++
			return calls == 3, fmt.Sprintf("call %d", calls)
		}, func() { t.Error("onTimeout ran without a timeout") })
		if fatal != "" || calls != 3 {
			t.Errorf("got failure %q after %d calls, want none after 3", fatal, calls)
		}
	})
	t.Run("timeout", func(t *testing.T) {
		calls, dumped := 0, false
		began := time.Now()
		fatal := waitFor(t, 300*time.Millisecond, func(context.Context) (bool, string) {
			calls++
			return false, fmt.Sprintf("call %d", calls)
		}, func() { dumped = true })
		if elapsed := time.Since(began); elapsed > 5*time.Second {
			t.Errorf("returned after %s, want about the 300ms timeout", elapsed)
		}
		for _, want := range []string{"the thing", "300ms", fmt.Sprintf("last state: call %d", calls)} {
			if !strings.Contains(fatal, want) {
				t.Errorf("failure %q does not say %q", fatal, want)
			}
		}
		if !dumped {
			t.Error("onTimeout did not run")
		}
	})
}
