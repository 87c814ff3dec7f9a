// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

// Package controlplane starts a real kube-apiserver and etcd for tests (controller-runtime's
// envtest with the binaries the tools module builds), installs the module's CRDs, and hands out
// clients, including clients that act as a given service account.
package controlplane

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
)

var setLoggerOnce sync.Once

// Options change how the control plane starts.
type Options struct {
	// APIServerFlags are extra kube-apiserver flags without the leading dashes, for example
	// {"service-cluster-ip-range": "10.96.0.0/16"}.
	APIServerFlags map[string]string
	// ExtraCRDPaths are files or folders of further CRDs to install (monitoring kinds, ...).
	ExtraCRDPaths []string
	// SkipModuleCRDs leaves the module's own CRD out.
	SkipModuleCRDs bool
	// Output receives the output of kube-apiserver and etcd. Nil discards it unless
	// SWH_TEST_CONTROLPLANE_OUTPUT=1 is set, which sends it to stderr.
	Output io.Writer
}

// Env is a running control plane.
type Env struct {
	// Config is an administrator's config (group system:masters, which bypasses RBAC).
	Config *rest.Config
	// Client is an administrator's client that knows the module's types.
	Client client.Client
	// Scheme knows the built-in types and the module's types.
	Scheme *runtime.Scheme

	env *envtest.Environment
}

// NewScheme returns a scheme with the built-in types and the module's types.
func NewScheme() *runtime.Scheme {
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		panic(err)
	}
	if err := v1alpha1.AddToScheme(s); err != nil {
		panic(err)
	}
	return s
}

// Start starts etcd and kube-apiserver and installs the CRDs. Call Stop when done.
func Start(opts Options) (*Env, error) {
	binDir, err := BinDir()
	if err != nil {
		return nil, err
	}
	root, err := RepoRoot()
	if err != nil {
		return nil, err
	}
	var crdPaths []string
	if !opts.SkipModuleCRDs {
		crdPaths = append(crdPaths, filepath.Join(root, "crds", "servicewithhealthchecks.yaml"))
	}
	crdPaths = append(crdPaths, opts.ExtraCRDPaths...)

	setLoggerOnce.Do(func() {
		// controller-runtime complains loudly when no logger is set; tests that want its logs
		// set SWH_TEST_LOG=1 to see them on stderr.
		if os.Getenv("SWH_TEST_LOG") == "1" {
			ctrllog.SetLogger(zap.New(zap.WriteTo(os.Stderr), zap.UseDevMode(true)))
		} else {
			ctrllog.SetLogger(logr.Discard())
		}
	})

	scheme := NewScheme()
	te := &envtest.Environment{
		BinaryAssetsDirectory:    binDir,
		CRDDirectoryPaths:        crdPaths,
		ErrorIfCRDPathMissing:    true,
		Scheme:                   scheme,
		ControlPlaneStartTimeout: 2 * time.Minute,
		ControlPlaneStopTimeout:  time.Minute,
	}
	// No kubectl is built: point the finder at a path that exists so it does not search.
	te.ControlPlane.KubectlPath = "/bin/false"
	out := opts.Output
	if out == nil && os.Getenv("SWH_TEST_CONTROLPLANE_OUTPUT") == "1" {
		out = os.Stderr
	}
	if out != nil {
		te.AttachControlPlaneOutput = true
		api := te.ControlPlane.GetAPIServer()
		api.Out, api.Err = out, out
	}
	args := te.ControlPlane.GetAPIServer().Configure()
	for k, v := range opts.APIServerFlags {
		args.Set(k, v)
	}

	cfg, err := te.Start()
	if err != nil {
		_ = te.Stop()
		return nil, fmt.Errorf("starting kube-apiserver and etcd from %s: %w", binDir, err)
	}
	cfg.QPS, cfg.Burst = 1000, 2000
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		_ = te.Stop()
		return nil, fmt.Errorf("creating client: %w", err)
	}
	return &Env{Config: cfg, Client: c, Scheme: scheme, env: te}, nil
}

// StartForTest starts a control plane that stops when the test ends.
func StartForTest(t testing.TB, opts Options) *Env {
	t.Helper()
	e, err := Start(opts)
	if err != nil {
		t.Fatalf("control plane: %v", err)
	}
	t.Cleanup(func() {
		if err := e.Stop(); err != nil {
			t.Errorf("stopping control plane: %v", err)
		}
	})
	return e
}

// Stop stops kube-apiserver and etcd and removes their data.
func (e *Env) Stop() error {
	return e.env.Stop()
}

// APIServerURL is the address of the API server.
func (e *Env) APIServerURL() string {
	return e.Config.Host
}

// APIServerPID returns the process id of this Env's kube-apiserver: the process whose command
// line is a kube-apiserver with this Env's own --cert-dir (a temporary directory unique to each
// Env), found by scanning /proc. Other API servers on the machine never match.
func (e *Env) APIServerPID() (int, error) {
	certDir := e.env.ControlPlane.GetAPIServer().CertDir
	if certDir == "" {
		return 0, errors.New("the API server has no certificate directory: not started")
	}
	want := "--cert-dir=" + certDir
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, fmt.Errorf("listing /proc: %w", err)
	}
	for _, ent := range entries {
		pid, err := strconv.Atoi(ent.Name())
		if err != nil {
			continue
		}
		raw, err := os.ReadFile(filepath.Join("/proc", ent.Name(), "cmdline"))
		if err != nil || len(raw) == 0 {
			continue // gone meanwhile, or a kernel thread
		}
		args := strings.Split(strings.TrimRight(string(raw), "\x00"), "\x00")
		if filepath.Base(args[0]) != "kube-apiserver" {
			continue
		}
		if slices.Contains(args[1:], want) {
			return pid, nil
		}
	}
	return 0, fmt.Errorf("no kube-apiserver process with %s in /proc", want)
}

// Freeze stops this Env's kube-apiserver with SIGSTOP (an API outage: connections hang, nothing
// answers) until Thaw. Only that one process is signalled.
func (e *Env) Freeze() error { return e.signalAPIServer(syscall.SIGSTOP) }

// Thaw resumes this Env's kube-apiserver after Freeze with SIGCONT.
func (e *Env) Thaw() error { return e.signalAPIServer(syscall.SIGCONT) }

func (e *Env) signalAPIServer(sig syscall.Signal) error {
	pid, err := e.APIServerPID()
	if err != nil {
		return err
	}
	if err := syscall.Kill(pid, sig); err != nil {
		return fmt.Errorf("sending %v to kube-apiserver (pid %d): %w", sig, pid, err)
	}
	return nil
}

// KubeConfig returns a kubeconfig for the administrator, for programs started by tests.
func (e *Env) KubeConfig() []byte {
	return e.env.KubeConfig
}

// WriteKubeConfig writes the administrator's kubeconfig into dir and returns its path.
func (e *Env) WriteKubeConfig(dir string) (string, error) {
	p := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(p, e.env.KubeConfig, 0o600); err != nil {
		return "", fmt.Errorf("writing kubeconfig: %w", err)
	}
	return p, nil
}

// KubeConfigFor returns a kubeconfig with a client certificate for user in groups, signed by
// the API server's client CA: a real credential, not impersonation (a kubelet's node
// credential is system:node:<name> in system:nodes, which the Node authorizer and the
// NodeRestriction admission plugin recognise).
func (e *Env) KubeConfigFor(user string, groups ...string) ([]byte, error) {
	u, err := e.env.AddUser(envtest.User{Name: user, Groups: groups}, nil)
	if err != nil {
		return nil, fmt.Errorf("adding user %s: %w", user, err)
	}
	return u.KubeConfig()
}

// ConfigAs returns a config that impersonates a user with groups. envtest's administrator is
// in system:masters and bypasses RBAC; an impersonated user does not.
func (e *Env) ConfigAs(user string, groups ...string) *rest.Config {
	cfg := rest.CopyConfig(e.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: groups}
	return cfg
}

// ServiceAccountConfig returns a config that acts as the service account namespace/name, with
// the groups the API server gives every service account.
func (e *Env) ServiceAccountConfig(namespace, name string) *rest.Config {
	return e.ConfigAs(ServiceAccountUser(namespace, name),
		"system:serviceaccounts", "system:serviceaccounts:"+namespace, "system:authenticated")
}

// ServiceAccountClient is a client that acts as the service account namespace/name.
func (e *Env) ServiceAccountClient(namespace, name string) (client.Client, error) {
	return client.New(e.ServiceAccountConfig(namespace, name), client.Options{Scheme: e.Scheme})
}

// ServiceAccountUser is the user name of a service account.
func ServiceAccountUser(namespace, name string) string {
	return "system:serviceaccount:" + namespace + ":" + name
}

// CreateNamespace creates a namespace with a generated name that starts with prefix.
func (e *Env) CreateNamespace(ctx context.Context, prefix string) (string, error) {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: prefix + "-"}}
	if err := e.Client.Create(ctx, ns); err != nil {
		return "", fmt.Errorf("creating namespace: %w", err)
	}
	return ns.Name, nil
}

// CreateNamespaceForTest is CreateNamespace for a test.
func (e *Env) CreateNamespaceForTest(t testing.TB, prefix string) string {
	t.Helper()
	ns, err := e.CreateNamespace(context.Background(), prefix)
	if err != nil {
		t.Fatal(err)
	}
	return ns
}

// RepoRoot is the folder that holds go.work, found from the working directory up.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.work")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.work above the working directory: run the tests inside the repository")
		}
		dir = parent
	}
}

// BinDir is the folder with kube-apiserver, etcd and the other Kubernetes binaries:
// $KUBEBUILDER_ASSETS when set, otherwise the cache folder tools/build.sh builds into.
func BinDir() (string, error) {
	if d := os.Getenv("KUBEBUILDER_ASSETS"); d != "" {
		return d, nil
	}
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	out, err := exec.Command("bash", filepath.Join(root, "tools", "build.sh"), "--dir", "kube").Output()
	if err != nil {
		return "", fmt.Errorf("finding the tools folder: %w", err)
	}
	d := strings.TrimSpace(string(out))
	if _, err := os.Stat(filepath.Join(d, ".complete")); err != nil {
		return "", fmt.Errorf("kube-apiserver and etcd are not built yet (%s): run 'make tools'", d)
	}
	return d, nil
}

// Binary is the path of a binary built by the tools module (kube-proxy, ...).
func Binary(name string) (string, error) {
	d, err := BinDir()
	if err != nil {
		return "", err
	}
	p := filepath.Join(d, name)
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("%s is not built: run 'make tools': %w", name, err)
	}
	return p, nil
}

// Main runs a package's tests against one control plane, started before them and stopped
// after; it stores the control plane in *env and exits. Use it as the whole TestMain:
//
//	func TestMain(m *testing.M) { controlplane.Main(m, controlplane.Options{}, &env) }
func Main(m *testing.M, opts Options, env **Env) {
	e, err := Start(opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	*env = e
	code := m.Run()
	if err := e.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "stopping the control plane:", err)
		if code == 0 {
			code = 1
		}
	}
	os.Exit(code)
}
