// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package credentials

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/deckhouse/service-with-healthchecks/api/wellknown"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/metrics"
)

// Error says why a referenced Secret cannot be used. Its message names the Secret and the
// problem and never contains a value of the Secret.
type Error struct {
	// Secret is the namespace and name of the Secret.
	Secret types.NamespacedName
	// Problem is what is wrong, e.g. "not found", "wrong type ...", "key password missing".
	Problem string
	// loading is set while the Secret's watch has not synced yet, within LoadGrace.
	loading bool
}

func (e *Error) Error() string {
	return fmt.Sprintf("credentials Secret %s: %s", e.Secret, e.Problem)
}

// Is makes errors.Is(err, ErrLoading) true while the Secret is still loading.
func (e *Error) Is(target error) bool {
	return target == ErrLoading && e.loading
}

// ErrLoading matches (errors.Is) the Error of a Secret whose watch has not synced yet, within
// LoadGrace of its start: the Secret is not known to be missing or broken, only not read yet.
// A probe that needs it is not run rather than failed, so an agent that has just started (or a
// probe that has just been given a Secret) does not withdraw an endpoint before it could know.
var ErrLoading = errors.New("credentials Secret still loading")

// LoadGrace is how long a Secret may stay "not loaded yet" before that counts as a problem.
const LoadGrace = 30 * time.Second

// Options configure a Store.
type Options struct {
	// Logger receives watch start/stop and Secret problems; default discards.
	Logger logr.Logger
	// OnChange, when set, is called (from a watch goroutine, must not block) after a referenced
	// Secret was added, changed or deleted, so callers can re-probe at once.
	OnChange func(types.NamespacedName)
}

// Store holds the parsed credential Secrets that are referenced. Lookup is safe for concurrent
// use with SetReferences.
type Store struct {
	client kubernetes.Interface
	opts   Options

	mu      sync.RWMutex
	entries map[types.NamespacedName]*entry
}

type entry struct {
	ref      types.NamespacedName
	started  time.Time // when the watch started (LoadGrace)
	informer cache.SharedIndexInformer
	stop     chan struct{}
	done     chan struct{}

	mu       sync.RWMutex
	creds    *Credentials
	problem  string // non-empty when the Secret exists but cannot be used
	present  bool
	watchErr string // last list/watch error, shown until the Secret is loaded
	// wrongType is set with problem when the Secret has another type than the credential type.
	wrongType bool
}

// NewStore returns an empty store; SetReferences starts its watches.
func NewStore(client kubernetes.Interface, opts Options) *Store {
	if opts.Logger.GetSink() == nil {
		opts.Logger = logr.Discard()
	}
	return &Store{client: client, opts: opts, entries: map[types.NamespacedName]*entry{}}
}

// SetReferences makes the store watch exactly these Secrets: it starts a watch for each new
// reference and stops the watches of references that are gone.
func (s *Store) SetReferences(refs []types.NamespacedName) {
	want := make(map[types.NamespacedName]struct{}, len(refs))
	for _, r := range refs {
		want[r] = struct{}{}
	}
	var stopped []*entry
	s.mu.Lock()
	for ref, e := range s.entries {
		if _, ok := want[ref]; !ok {
			delete(s.entries, ref)
			stopped = append(stopped, e)
		}
	}
	for ref := range want {
		if _, ok := s.entries[ref]; !ok {
			s.entries[ref] = s.start(ref)
		}
	}
	s.mu.Unlock()
	for _, e := range stopped {
		close(e.stop)
		<-e.done
		s.opts.Logger.V(1).Info("stopped watching credential Secret", "secret", e.ref)
	}
}

// References returns the Secrets the store watches.
func (s *Store) References() []types.NamespacedName {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make([]types.NamespacedName, 0, len(s.entries))
	for ref := range s.entries {
		out = append(out, ref)
	}
	return out
}

// Stop stops every watch and waits for them to end.
func (s *Store) Stop() {
	s.SetReferences(nil)
}

// Lookup returns the credentials of a referenced Secret, or an *Error that names the Secret and
// the problem: not referenced, not loaded yet (with the last API error, e.g. Forbidden), not
// found, wrong type, or malformed.
func (s *Store) Lookup(namespace, name string) (*Credentials, error) {
	ref := types.NamespacedName{Namespace: namespace, Name: name}
	s.mu.RLock()
	e, ok := s.entries[ref]
	s.mu.RUnlock()
	if !ok {
		return nil, &Error{Secret: ref, Problem: "not referenced by any probe (no watch)"}
	}
	e.mu.RLock()
	defer e.mu.RUnlock()
	switch {
	case e.creds != nil:
		return e.creds, nil
	case e.problem != "":
		return nil, &Error{Secret: ref, Problem: e.problem}
	case e.informer.HasSynced():
		return nil, &Error{Secret: ref, Problem: "not found"}
	case e.watchErr != "":
		return nil, &Error{Secret: ref, Problem: "cannot be read: " + e.watchErr}
	case time.Since(e.started) < LoadGrace:
		return nil, &Error{Secret: ref, Problem: "not loaded yet", loading: true}
	default:
		return nil, &Error{Secret: ref, Problem: fmt.Sprintf("not loaded after %s", LoadGrace)}
	}
}

// Problem kinds of a referenced Secret that cannot be used, as Problems counts them: the label
// values of the agent's problem gauge, defined once in package metrics.
const (
	ProblemMissing    = metrics.ProblemMissing
	ProblemWrongType  = metrics.ProblemWrongType
	ProblemMalformed  = metrics.ProblemMalformed
	ProblemUnreadable = metrics.ProblemUnreadable
)

// ProblemKinds are all problem kinds, in a fixed order.
var ProblemKinds = metrics.CredentialProblemKinds

// Problems counts the referenced Secrets that cannot be used, by problem kind (every kind is
// present, zero when none). Secrets still loading are not counted.
func (s *Store) Problems() map[string]int {
	out := make(map[string]int, len(ProblemKinds))
	for _, k := range ProblemKinds {
		out[k] = 0
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	for _, e := range s.entries {
		if k := e.problemKind(); k != "" {
			out[k]++
		}
	}
	return out
}

// problemKind classifies the entry like Lookup does; "" when usable or still loading.
func (e *entry) problemKind() string {
	e.mu.RLock()
	defer e.mu.RUnlock()
	switch {
	case e.creds != nil:
		return ""
	case e.problem != "" && e.wrongType:
		return ProblemWrongType
	case e.problem != "":
		return ProblemMalformed
	case e.informer.HasSynced():
		return ProblemMissing
	case e.watchErr != "":
		return ProblemUnreadable
	default:
		return ""
	}
}

func (s *Store) start(ref types.NamespacedName) *entry {
	selector := fields.OneTermEqualSelector("metadata.name", ref.Name).String()
	secrets := s.client.CoreV1().Secrets(ref.Namespace)
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.FieldSelector = selector
			return secrets.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = selector
			return secrets.Watch(ctx, o)
		},
	}
	e := &entry{
		ref:     ref,
		started: time.Now(),
		stop:    make(chan struct{}),
		done:    make(chan struct{}),
		informer: cache.NewSharedIndexInformerWithOptions(lw, &corev1.Secret{},
			cache.SharedIndexInformerOptions{ObjectDescription: "credential Secret " + ref.String()}),
	}
	log := s.opts.Logger.WithValues("secret", ref)
	_ = e.informer.SetWatchErrorHandlerWithContext(func(_ context.Context, _ *cache.Reflector, err error) {
		msg := err.Error()
		if apierrors.IsForbidden(err) {
			msg = "Forbidden: the agent's Role does not grant it (resourceNames)"
		}
		e.mu.Lock()
		e.watchErr = msg
		e.mu.Unlock()
		log.Info("watching credential Secret failed", "err", msg)
	})
	update := func(obj any) {
		secret, ok := obj.(*corev1.Secret)
		if !ok {
			return
		}
		creds, err := Parse(secret)
		e.mu.Lock()
		e.present, e.creds, e.problem, e.watchErr = true, creds, "", ""
		e.wrongType = err != nil && !wellknown.IsCredentialSecretType(string(secret.Type))
		if err != nil {
			e.problem = err.Error()
		}
		e.mu.Unlock()
		if err != nil {
			log.Info("credential Secret cannot be used", "problem", err.Error())
		}
		if s.opts.OnChange != nil {
			s.opts.OnChange(ref)
		}
	}
	_, _ = e.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { update(obj) },
		UpdateFunc: func(_, obj any) { update(obj) },
		DeleteFunc: func(any) {
			e.mu.Lock()
			e.present, e.creds, e.problem, e.wrongType = false, nil, "", false
			e.mu.Unlock()
			if s.opts.OnChange != nil {
				s.opts.OnChange(ref)
			}
		},
	})
	go func() {
		defer close(e.done)
		e.informer.Run(e.stop)
	}()
	log.V(1).Info("watching credential Secret")
	return e
}
