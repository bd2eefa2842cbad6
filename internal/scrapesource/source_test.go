package scrapesource

import (
	"testing"

	"sigs.k8s.io/controller-runtime/pkg/client/fake"
)

func TestReaderOnlyOnceSetAndElected(t *testing.T) {
	var s Source
	if s.Reader() != nil {
		t.Fatal("a zero Source returned a reader")
	}
	r := fake.NewClientBuilder().Build()
	elected := make(chan struct{})
	s.Serve(r, elected)
	if s.Reader() != nil {
		t.Fatal("a reader before the election")
	}
	close(elected)
	if s.Reader() != r {
		t.Fatal("no reader after the election")
	}
	s.Serve(r, nil)
	if s.Reader() != r {
		t.Fatal("no reader without an election channel")
	}
}
