// Package ui serves the live fleet view in the browser (`gpufleet ui`):
// informers on every kind the view reads, the rows of the nodes a change
// touches built again (fleet.Build over those nodes' objects) and pushed
// to the page as server-sent events, a node's story (fleet.Explain) on a
// click. The page talks only to this process;
// it never sees the user's credentials, and there are no write actions.
package ui

import (
	"bytes"
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"maps"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	maintenancev1 "github.com/gpufleet/gpufleet/api/maintenance/v1alpha1"
	repairv1 "github.com/gpufleet/gpufleet/api/repair/v1alpha1"
	"github.com/gpufleet/gpufleet/internal/fleet"
)

// DefaultAddress is where the view listens by default: loopback only.
const DefaultAddress = "127.0.0.1:8090"

// coalesce is how long a burst of changes is gathered into one update.
const coalesce = 50 * time.Millisecond

// everything is the work queue's key for building the whole view again
// (the config or a ComputeDomain changed); every other key is a node's
// name.
const everything = "*"

// indexNode is the cache index of the objects of a node (spec.nodeName;
// for a claim, the node of its allocated GPUs).
const indexNode = "gpufleet.node"

//go:embed static
var static embed.FS

var indexTemplate = template.Must(template.ParseFS(static, "static/index.html"))

// Options configure the view.
type Options struct {
	// PoolLabel names the node label of the pool (default fleet.DefaultPoolLabel).
	PoolLabel string
	// ConfigNamespace is the operator's namespace: the view watches the
	// MaintenanceOperatorConfig "default" there and groups the nodes by
	// NVLink domain while it has spec.domains ("": never).
	ConfigNamespace string
	// Clock (default: the real one).
	Clock clock.PassiveClock
}

// Server is the fleet view.
type Server struct {
	opts   Options
	direct client.Client
	cache  cache.Cache

	kinds       []kindInfo
	unavailable map[fleet.Kind]string

	// queue holds the nodes whose rows a change touched (everything: the
	// whole view); one worker builds them again.
	queue workqueue.TypedRateLimitingInterface[string]

	mu      sync.Mutex
	current *fleet.Fleet
	pos     map[string]int    // node -> index of its row in current.Rows
	rows    map[string][]byte // node -> JSON of its row, as last sent
	domains []byte            // JSON of the domain label and domains, as last sent
	subs    map[chan []byte]struct{}
	ready   chan struct{}

	// rowsBuilt counts the rows built since the start (the cost of a
	// change is the rows it builds again, not the fleet).
	rowsBuilt atomic.Int64
}

type kindInfo struct {
	kind fleet.Kind
	obj  client.Object
	list client.ObjectList
	// namespace: watched in this namespace only ("": all).
	namespace string
	// optional: not watched, and not noted, when it cannot be read.
	optional bool
}

// New prepares the view of the cluster cfg points to. Start it with
// Start, then Serve.
func New(cfg *rest.Config, opts Options) (*Server, error) {
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	scheme := fleet.Scheme()
	direct, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return nil, fmt.Errorf("connecting to the cluster: %w", err)
	}
	byObject := map[client.Object]cache.ByObject{
		&resourcev1.ResourceSlice{}: {Field: fields.OneTermEqualSelector("spec.driver", fleet.DRADriver)},
	}
	kinds := []kindInfo{
		{kind: fleet.KindNode, obj: &corev1.Node{}, list: &corev1.NodeList{}},
		{kind: fleet.KindPod, obj: &corev1.Pod{}, list: &corev1.PodList{}},
		{kind: fleet.KindResourceClaim, obj: &resourcev1.ResourceClaim{}, list: &resourcev1.ResourceClaimList{}},
		{kind: fleet.KindResourceSlice, obj: &resourcev1.ResourceSlice{}, list: &resourcev1.ResourceSliceList{}},
		{kind: fleet.KindNodeMaintenance, obj: &maintenancev1.NodeMaintenance{}, list: &maintenancev1.NodeMaintenanceList{}},
		{kind: fleet.KindNodeRepair, obj: &repairv1.NodeRepair{}, list: &repairv1.NodeRepairList{}},
		{kind: fleet.KindGPUFault, obj: &repairv1.GPUFault{}, list: &repairv1.GPUFaultList{}},
	}
	if ns := opts.ConfigNamespace; ns != "" {
		config := &maintenancev1.MaintenanceOperatorConfig{}
		byObject[config] = cache.ByObject{Namespaces: map[string]cache.Config{ns: {}}}
		// The ComputeDomains' metadata names their UIDs; without them
		// (not installed, forbidden) the page shows the UIDs.
		cd := &metav1.PartialObjectMetadata{}
		cd.SetGroupVersionKind(fleet.ComputeDomainGVK)
		cds := &metav1.PartialObjectMetadataList{}
		cds.SetGroupVersionKind(fleet.ComputeDomainListGVK)
		kinds = append(kinds,
			kindInfo{kind: fleet.KindMaintenanceConfig, obj: config, list: &maintenancev1.MaintenanceOperatorConfigList{}, namespace: ns},
			kindInfo{kind: fleet.KindComputeDomain, obj: cd, list: cds, optional: true})
	}
	c, err := cache.New(cfg, cache.Options{
		Scheme: scheme, DefaultTransform: fleet.Trim, ByObject: byObject,
		// The view lists from the cache without copying; Build only reads.
		DefaultUnsafeDisableDeepCopy: ptrTo(true),
	})
	if err != nil {
		return nil, fmt.Errorf("creating the cache: %w", err)
	}
	qcfg := workqueue.TypedRateLimitingQueueConfig[string]{}
	if clk, ok := opts.Clock.(clock.WithTicker); ok {
		qcfg.Clock = clk
	}
	return &Server{
		opts: opts, direct: direct, cache: c, unavailable: map[fleet.Kind]string{},
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](), qcfg),
		pos:   map[string]int{}, rows: map[string][]byte{}, subs: map[chan []byte]struct{}{}, ready: make(chan struct{}),
		kinds: kinds,
	}, nil
}

func ptrTo[T any](v T) *T { return &v }

// Start probes which kinds can be read (a kind whose CRD is missing or
// that RBAC forbids is noted and not watched), starts one informer per
// readable kind, waits for them to sync, builds the first view, and keeps
// building the rows of the nodes each change touches until ctx ends.
func (s *Server) Start(ctx context.Context) error {
	var readable []kindInfo
	for _, k := range s.kinds {
		err := s.direct.List(ctx, k.list, client.Limit(1), client.InNamespace(k.namespace))
		if err == nil {
			readable = append(readable, k)
			continue
		}
		if k.optional {
			continue
		}
		why := fleet.Unreadable(err)
		switch {
		case why == "" || k.kind == fleet.KindNode:
			return fmt.Errorf("listing %s: %w", k.kind, err)
		case k.kind == fleet.KindMaintenanceConfig:
			// Not installed: nothing to note (no domains). Forbidden:
			// say that the nodes are not grouped.
			if why, err = fleet.ConfigUnreadable(err); err != nil {
				return fmt.Errorf("listing %s: %w", k.kind, err)
			}
			if why != "" {
				s.unavailable[k.kind] = why
			}
			continue
		}
		s.unavailable[k.kind] = why
	}
	s.kinds = readable
	for _, k := range s.kinds {
		if k.kind != fleet.KindNode && nodeOf(k.obj) != everything {
			if err := s.cache.IndexField(ctx, k.obj, indexNode, indexByNode); err != nil {
				return fmt.Errorf("indexing %s by node: %w", k.kind, err)
			}
		}
		inf, err := s.cache.GetInformer(ctx, k.obj, cache.BlockUntilSynced(false))
		if err != nil {
			return fmt.Errorf("watching %s: %w", k.kind, err)
		}
		if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerDetailedFuncs{
			AddFunc: func(o any, initial bool) {
				if !initial { // the first view, built once the caches are synced, has them
					s.touch(o)
				}
			},
			UpdateFunc: s.updated,
			DeleteFunc: func(o any) { s.touch(o) },
		}); err != nil {
			return fmt.Errorf("watching %s: %w", k.kind, err)
		}
	}
	errc := make(chan error, 1)
	go func() { errc <- s.cache.Start(ctx) }()
	if !s.cache.WaitForCacheSync(ctx) {
		select {
		case err := <-errc:
			return fmt.Errorf("watching the cluster: %w", err)
		default:
			return fmt.Errorf("watching the cluster: %w", ctx.Err())
		}
	}
	if err := s.rebuild(ctx); err != nil {
		return err
	}
	close(s.ready)
	go func() {
		<-ctx.Done()
		s.queue.ShutDown()
		s.closeSubscribers()
	}()
	go s.work(ctx)
	return nil
}

// updated queues the nodes an update touched when it changed what the view
// reads: a node's status heartbeat (its conditions' heartbeat times,
// dropped by fleet.Trim), or any change it drops, builds nothing. At 10,000
// nodes the kubelets' heartbeats alone are ~30 updates a second.
func (s *Server) updated(old, cur any) { s.enqueue(touched(old, cur)) }

// touch queues the node of an object added or deleted.
func (s *Server) touch(o any) { s.enqueue(touched(nil, o)) }

func (s *Server) enqueue(keys []string) {
	for _, key := range keys {
		s.queue.AddAfter(key, coalesce)
	}
}

// touched are the queue keys of a change from old (nil: none) to cur: the
// nodes of both versions (a pod not bound to one touches none), nothing
// when the update changed nothing the view reads. The changes of a burst
// are built once, coalesce after the first.
func touched(old, cur any) []string {
	if d, ok := cur.(toolscache.DeletedFinalStateUnknown); ok {
		cur = d.Obj
	}
	if old != nil && !viewChanged(old, cur) {
		return nil
	}
	var keys []string
	for _, o := range []any{old, cur} {
		if o == nil {
			continue
		}
		if key := nodeOf(o); key != "" && !slices.Contains(keys, key) {
			keys = append(keys, key)
		}
	}
	return keys
}

// nodeOf is the node whose row an object is part of ("": none), or
// everything for the objects every row may read.
func nodeOf(o any) string {
	switch v := o.(type) {
	case *corev1.Node:
		return v.Name
	case *corev1.Pod:
		return v.Spec.NodeName
	case *resourcev1.ResourceClaim:
		return fleet.ClaimNode(v)
	case *resourcev1.ResourceSlice:
		return ptr.Deref(v.Spec.NodeName, "")
	case *maintenancev1.NodeMaintenance:
		return v.Spec.NodeName
	case *repairv1.NodeRepair:
		return v.Spec.NodeName
	case *repairv1.GPUFault:
		return v.Spec.NodeName
	}
	return everything
}

// indexByNode indexes an object under its node (indexNode).
func indexByNode(o client.Object) []string {
	if n := nodeOf(o); n != "" && n != everything {
		return []string{n}
	}
	return nil
}

// viewChanged reports whether two trimmed versions of an object differ in
// more than their resourceVersion (false for a resync, which repeats it).
func viewChanged(old, cur any) bool {
	o, ok := old.(client.Object)
	c, ok2 := cur.(client.Object)
	if !ok || !ok2 {
		return true
	}
	if o.GetResourceVersion() == c.GetResourceVersion() {
		return false
	}
	was, ok := o.DeepCopyObject().(client.Object) // the cache's object is not ours to change
	if !ok {
		return true
	}
	was.SetResourceVersion(c.GetResourceVersion())
	return !equality.Semantic.DeepEqual(was, c)
}

// work is the queue's one worker: it takes every node queued so far and
// builds their rows (no polling: it sleeps until a change is queued). A
// failed build is retried with the queue's backoff, and said on the page.
func (s *Server) work(ctx context.Context) {
	for {
		key, stop := s.queue.Get()
		if stop {
			return
		}
		batch := []string{key}
		for s.queue.Len() > 0 {
			k, stop := s.queue.Get()
			if stop {
				break
			}
			batch = append(batch, k)
		}
		err := s.refresh(ctx, batch)
		for _, k := range batch {
			if err != nil {
				s.queue.AddRateLimited(k)
			} else {
				s.queue.Forget(k)
			}
			s.queue.Done(k)
		}
		if err != nil && ctx.Err() == nil {
			s.broadcast(event("problem", map[string]string{"message": err.Error()}))
		}
	}
}

// refresh builds the rows of the nodes queued (the whole view when
// everything is among them).
func (s *Server) refresh(ctx context.Context, keys []string) error {
	if slices.Contains(keys, everything) {
		return s.rebuild(ctx)
	}
	snap, err := s.snapshotOf(ctx, keys)
	if err != nil {
		return err
	}
	return s.apply(fleet.Build(snap, s.opts.Clock.Now()), keys)
}

// snapshot lists every readable kind from the cache.
func (s *Server) snapshot(ctx context.Context) (*fleet.Snapshot, error) {
	return s.snapshotOf(ctx, nil)
}

// snapshotOf lists from the cache the given nodes and their objects (nil:
// every node), with the objects every row may read.
func (s *Server) snapshotOf(ctx context.Context, nodes []string) (*fleet.Snapshot, error) {
	snap := &fleet.Snapshot{PoolLabel: s.opts.PoolLabel, Unavailable: maps.Clone(s.unavailable)}
	for _, k := range s.kinds {
		if err := s.listOf(ctx, k, nodes); err != nil {
			return nil, fmt.Errorf("listing %s from the cache: %w", k.kind, err)
		}
		items, err := meta.ExtractList(k.list)
		if err != nil {
			return nil, err
		}
		for _, o := range items {
			switch v := o.(type) {
			case *corev1.Node:
				snap.Nodes = append(snap.Nodes, v)
			case *corev1.Pod:
				snap.Pods = append(snap.Pods, v)
			case *resourcev1.ResourceClaim:
				snap.Claims = append(snap.Claims, v)
			case *resourcev1.ResourceSlice:
				snap.Slices = append(snap.Slices, v)
			case *maintenancev1.NodeMaintenance:
				snap.Maintenances = append(snap.Maintenances, v)
			case *repairv1.NodeRepair:
				snap.Repairs = append(snap.Repairs, v)
			case *repairv1.GPUFault:
				snap.Faults = append(snap.Faults, v)
			case *maintenancev1.MaintenanceOperatorConfig:
				if v.Namespace == s.opts.ConfigNamespace && v.Name == maintenancev1.DefaultConfigName {
					snap.Config = v
				}
			case *metav1.PartialObjectMetadata:
				snap.ComputeDomains = append(snap.ComputeDomains, v)
			}
		}
	}
	return snap, nil
}

// listOf fills k.list from the cache: every object, or those of the given
// nodes (a node kind by name, the others by their node's index).
func (s *Server) listOf(ctx context.Context, k kindInfo, nodes []string) error {
	if nodes == nil || nodeOf(k.obj) == everything {
		return s.cache.List(ctx, k.list)
	}
	var items []runtime.Object
	for _, n := range nodes {
		if k.kind == fleet.KindNode {
			node := &corev1.Node{}
			switch err := s.cache.Get(ctx, client.ObjectKey{Name: n}, node); {
			case apierrors.IsNotFound(err):
				continue // gone: its row goes
			case err != nil:
				return err
			}
			items = append(items, node)
			continue
		}
		if err := s.cache.List(ctx, k.list, client.MatchingFields{indexNode: n}); err != nil {
			return err
		}
		got, err := meta.ExtractList(k.list)
		if err != nil {
			return err
		}
		items = append(items, got...)
	}
	return meta.SetList(k.list, items)
}

// update is what the page receives after a change.
type update struct {
	Summary fleet.Summary `json:"summary"`
	// DomainLabel and Domains as in fleet.Fleet: the page groups the
	// nodes by domain while DomainLabel is set.
	DomainLabel string            `json:"domainLabel,omitempty"`
	Domains     []fleet.Domain    `json:"domains,omitempty"`
	Notes       []string          `json:"notes"`
	Changed     []json.RawMessage `json:"changed"`
	Removed     []string          `json:"removed"`
}

// rebuild builds the whole view again (at the start, and when the config
// or a ComputeDomain changed).
func (s *Server) rebuild(ctx context.Context) error {
	snap, err := s.snapshot(ctx)
	if err != nil {
		return err
	}
	return s.apply(fleet.Build(snap, s.opts.Clock.Now()), nil)
}

// apply puts the rows just built into the view and sends the page what
// changed. nodes are the nodes they were built for (nil: every node, f is
// the whole view): a node among them without a row is gone. The summary
// is kept by taking each old row out and counting its new one in; only
// with domains are the rows regrouped and the domains summarised again
// (over every row).
func (s *Server) apply(f *fleet.Fleet, nodes []string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.opts.Clock.Now()
	cur := s.current
	if nodes == nil || cur == nil {
		cur = &fleet.Fleet{TypeMeta: f.TypeMeta, Summary: fleet.Summary{Pools: map[string]int{}}, DomainLabel: f.DomainLabel,
			Rows: make([]fleet.Row, 0, len(f.Rows))}
		s.pos = map[string]int{}
		nodes = slices.Collect(maps.Keys(s.rows))
	}
	u := update{Changed: []json.RawMessage{}, Removed: []string{}}
	regroup := false
	built := make(map[string]bool, len(f.Rows))
	for i := range f.Rows {
		r := f.Rows[i]
		built[r.Node] = true
		s.rowsBuilt.Add(1)
		if !r.Recheck.IsZero() {
			s.queue.AddAfter(r.Node, r.Recheck.Sub(now)) // it changes with time alone then
		}
		if at, ok := s.pos[r.Node]; ok {
			old := &cur.Rows[at]
			cur.Summary.Add(old, -1)
			regroup = regroup || old.Domain != r.Domain
			cur.Rows[at] = r
		} else {
			s.pos[r.Node] = len(cur.Rows)
			cur.Rows = append(cur.Rows, r)
			regroup = true
		}
		cur.Summary.Add(&r, 1)
		data, err := json.Marshal(&r)
		if err != nil {
			return err
		}
		if !bytes.Equal(s.rows[r.Node], data) {
			s.rows[r.Node] = data
			u.Changed = append(u.Changed, data)
		}
	}
	for _, name := range nodes {
		if _, shown := s.rows[name]; built[name] || !shown {
			continue
		}
		if at, ok := s.pos[name]; ok {
			cur.Summary.Add(&cur.Rows[at], -1)
			cur.Rows[at].Node = "" // dropped below
			delete(s.pos, name)
		}
		delete(s.rows, name)
		u.Removed = append(u.Removed, name)
		regroup = true
	}
	if regroup {
		cur.Rows = slices.DeleteFunc(cur.Rows, func(r fleet.Row) bool { return r.Node == "" })
		fleet.SortRows(cur.Rows, cur.DomainLabel != "")
		clear(s.pos)
		for i := range cur.Rows {
			s.pos[cur.Rows[i].Node] = i
		}
	}
	if cur.DomainLabel != "" {
		cur.Domains = fleet.Domains(cur.Rows)
	}
	cur.Notes = f.Notes
	domains, err := json.Marshal([]any{cur.DomainLabel, cur.Domains})
	if err != nil {
		return err
	}
	domainsChanged := !bytes.Equal(s.domains, domains)
	s.domains = domains
	s.current = cur
	u.Summary, u.DomainLabel, u.Domains, u.Notes = cur.Summary, cur.DomainLabel, cur.Domains, cur.Notes
	if len(u.Changed) > 0 || len(u.Removed) > 0 || domainsChanged {
		s.broadcastLocked(event("update", u))
	}
	return nil
}

func event(name string, v any) []byte {
	data, err := json.Marshal(v)
	if err != nil {
		data = []byte(`{}`)
	}
	return []byte("event: " + name + "\ndata: " + string(data) + "\n\n")
}

func (s *Server) broadcast(msg []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.broadcastLocked(msg)
}

// broadcastLocked sends msg to every page; a page too slow to keep up is
// dropped (its EventSource reconnects and gets a fresh snapshot).
func (s *Server) broadcastLocked(msg []byte) {
	for ch := range s.subs {
		select {
		case ch <- msg:
		default:
			delete(s.subs, ch)
			close(ch)
		}
	}
}

func (s *Server) closeSubscribers() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for ch := range s.subs {
		delete(s.subs, ch)
		close(ch)
	}
}

// subscribe returns the current view as a snapshot event and a channel of
// the updates after it.
func (s *Server) subscribe() ([]byte, chan []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ch := make(chan []byte, 64)
	s.subs[ch] = struct{}{}
	return event("snapshot", s.current), ch
}

func (s *Server) unsubscribe(ch chan []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.subs[ch]; ok {
		delete(s.subs, ch)
		close(ch)
	}
}

// Handler is the view's HTTP handler: the page, its static files, the
// event stream and a node's story. Only GET and HEAD; requests for
// another host than the listener's are refused when it is on loopback
// (no DNS rebinding).
func (s *Server) Handler(loopback bool) http.Handler {
	mux := http.NewServeMux()
	sub, _ := fs.Sub(static, "static")
	mux.Handle("GET /static/", http.StripPrefix("/static/", http.FileServerFS(sub)))
	mux.HandleFunc("GET /{$}", s.serveIndex)
	mux.HandleFunc("GET /api/events", s.serveEvents)
	mux.HandleFunc("GET /api/explain", s.serveExplain)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("X-Frame-Options", "DENY")
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			http.Error(w, "read-only view: only GET", http.StatusMethodNotAllowed)
			return
		}
		if loopback && !loopbackHost(r.Host) {
			http.Error(w, "this view answers only to localhost, 127.0.0.1 or [::1]", http.StatusForbidden)
			return
		}
		mux.ServeHTTP(w, r)
	})
}

func loopbackHost(hostport string) bool {
	host, _, err := net.SplitHostPort(hostport)
	if err != nil {
		host = hostport
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(strings.Trim(host, "[]"))
	return ip != nil && ip.IsLoopback()
}

func (s *Server) serveIndex(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	type state struct{ Name, Class string }
	var states []state
	for _, st := range fleet.States {
		states = append(states, state{string(st), "state-" + strings.ReplaceAll(string(st), " ", "-")})
	}
	if err := indexTemplate.Execute(w, map[string]any{"States": states}); err != nil {
		http.Error(w, "rendering the page failed", http.StatusInternalServerError)
	}
}

func (s *Server) serveEvents(w http.ResponseWriter, r *http.Request) {
	flusher, ok := w.(http.Flusher)
	if !ok {
		http.Error(w, "streaming unsupported", http.StatusInternalServerError)
		return
	}
	select {
	case <-s.ready:
	case <-r.Context().Done():
		return
	}
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	first, ch := s.subscribe()
	defer s.unsubscribe(ch)
	if _, err := w.Write(first); err != nil {
		return
	}
	flusher.Flush()
	for {
		select {
		case <-r.Context().Done():
			return
		case msg, ok := <-ch:
			if !ok {
				return
			}
			if _, err := w.Write(msg); err != nil {
				return
			}
			flusher.Flush()
		}
	}
}

func (s *Server) serveExplain(w http.ResponseWriter, r *http.Request) {
	node := r.URL.Query().Get("node")
	if node == "" {
		http.Error(w, "node is required", http.StatusBadRequest)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 20*time.Second)
	defer cancel()
	snap, err := s.snapshot(ctx)
	if err == nil {
		err = fleet.LoadEvents(ctx, s.direct, snap, node)
	}
	var st *fleet.Story
	if err == nil {
		st, err = fleet.Explain(snap, node, s.opts.Clock.Now())
	}
	var unknown *fleet.ErrUnknownNode
	switch {
	case errors.As(err, &unknown):
		http.Error(w, err.Error(), http.StatusNotFound)
		return
	case err != nil:
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_ = json.NewEncoder(w).Encode(st)
}

// Serve answers on ln until ctx ends.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	srv := &http.Server{Handler: s.Handler(isLoopback(ln.Addr())), ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		shutdown, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdown)
		_ = srv.Close()
	}()
	err := srv.Serve(ln)
	if errors.Is(err, http.ErrServerClosed) {
		return ctx.Err()
	}
	return err
}

func isLoopback(a net.Addr) bool {
	tcp, ok := a.(*net.TCPAddr)
	return ok && tcp.IP.IsLoopback()
}

// ListenAndServe starts the view, listens on address (warning through say
// when it is not loopback) and serves until ctx ends.
func (s *Server) ListenAndServe(ctx context.Context, address string, say func(string, ...any)) error {
	ln, err := net.Listen("tcp", address)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", address, err)
	}
	defer func() { _ = ln.Close() }()
	if !isLoopback(ln.Addr()) {
		say("WARNING: listening on %s, not loopback: anyone who can reach it sees your cluster's nodes with your credentials", ln.Addr())
	}
	began := time.Now()
	say("watching the cluster")
	if err := s.Start(ctx); err != nil {
		return err
	}
	say("%d nodes watched in %s; the fleet view is on http://%s/ (Ctrl-C stops)", s.nodeCount(), time.Since(began).Round(time.Millisecond), browsable(ln.Addr()))
	return s.Serve(ctx, ln)
}

// RowsBuilt counts the rows the view has built since it started: the
// first view builds one per node, a change one per node it touched.
func (s *Server) RowsBuilt() int64 { return s.rowsBuilt.Load() }

func (s *Server) nodeCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.rows)
}

// browsable is the address to type into a browser.
func browsable(a net.Addr) string {
	tcp, ok := a.(*net.TCPAddr)
	if ok && tcp.IP.IsUnspecified() {
		return fmt.Sprintf("127.0.0.1:%d", tcp.Port)
	}
	return a.String()
}
