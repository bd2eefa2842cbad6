// Package scrapesource is where the operator's scrape-time collectors read
// from: a cache reader, used only once this replica leads, so that series
// computed from objects at scrape time (no writes, no polling) are
// reported by one replica only.
package scrapesource

import (
	"sync/atomic"

	"sigs.k8s.io/controller-runtime/pkg/client"
)

type source struct {
	reader  client.Reader
	elected <-chan struct{}
}

// Source is set once the manager's cache exists; the zero Source reads
// nothing. Safe for concurrent use.
type Source struct{ src atomic.Pointer[source] }

// Serve makes the source read from reader once elected is closed (nil: at
// once).
func (s *Source) Serve(reader client.Reader, elected <-chan struct{}) {
	s.src.Store(&source{reader: reader, elected: elected})
}

// Reader is the reader to collect from, or nil when this replica must not
// report (no reader yet, or not the leader).
func (s *Source) Reader() client.Reader {
	src := s.src.Load()
	if src == nil {
		return nil
	}
	if src.elected != nil {
		select {
		case <-src.elected:
		default:
			return nil
		}
	}
	return src.reader
}
