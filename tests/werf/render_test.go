// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package werf

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"text/template"

	"github.com/Masterminds/sprig/v3"
	"github.com/stretchr/testify/require"
	"sigs.k8s.io/yaml"

	"github.com/deckhouse/service-with-healthchecks/tests/internal/bundle"
)

// files is what werf's templates see as .Files: the repository's files as git has them, with
// the uncommitted base_images.yml supplied by the test (absent when baseImages is nil).
type files struct {
	root       string
	baseImages []byte
}

const baseImagesFile = "base_images.yml"

// Get returns a file's content; werf refuses a file that is not there.
func (f files) Get(rel string) (string, error) {
	if rel == baseImagesFile {
		if f.baseImages == nil {
			return "", fmt.Errorf("%s does not exist", rel)
		}
		return string(f.baseImages), nil
	}
	data, err := os.ReadFile(filepath.Join(f.root, rel))
	if err != nil {
		return "", fmt.Errorf("reading %s: %w", rel, err)
	}
	return string(data), nil
}

// Exists reports whether a file is there.
func (f files) Exists(rel string) bool {
	if rel == baseImagesFile {
		return f.baseImages != nil
	}
	st, err := os.Stat(filepath.Join(f.root, rel))
	return err == nil && !st.IsDir()
}

// Glob maps the paths matching a pattern to their content.
func (f files) Glob(pattern string) (map[string]any, error) {
	matches, err := filepath.Glob(filepath.Join(f.root, pattern))
	if err != nil {
		return nil, fmt.Errorf("glob %s: %w", pattern, err)
	}
	out := map[string]any{}
	for _, m := range matches {
		rel, _ := filepath.Rel(f.root, m)
		data, err := os.ReadFile(m)
		if err != nil {
			return nil, fmt.Errorf("reading %s: %w", rel, err)
		}
		out[rel] = string(data)
	}
	return out, nil
}

// rendered is werf.yaml after templating: its documents and the environment variables read.
type rendered struct {
	docs []map[string]any
	envs []string
}

// renderWerf renders werf.yaml the way werf does: Go templates with sprig, werf's env (with an
// optional fallback), include, tpl, required, fromYaml and toYaml, and .Files; env are the
// variables the build sets.
func renderWerf(t *testing.T, baseImages []byte, env map[string]string) (rendered, error) {
	t.Helper()
	root, err := bundle.Root()
	require.NoError(t, err)
	var mu sync.Mutex
	read := map[string]bool{}
	tmpl := template.New("werf.yaml")
	funcs := sprig.TxtFuncMap()
	delete(funcs, "expandenv")
	funcs["env"] = func(name string, fallback ...string) (string, error) {
		if len(fallback) > 1 {
			return "", errors.New("env takes at most one fallback")
		}
		mu.Lock()
		read[name] = true
		mu.Unlock()
		if v := env[name]; v != "" {
			return v, nil
		}
		if len(fallback) == 1 {
			return fallback[0], nil
		}
		return "", nil
	}
	funcs["required"] = func(msg string, v any) (any, error) {
		if v == nil || v == "" {
			return v, errors.New(msg)
		}
		return v, nil
	}
	funcs["fromYaml"] = func(s string) (map[string]any, error) {
		m := map[string]any{}
		if err := yaml.Unmarshal([]byte(s), &m); err != nil {
			return nil, err
		}
		return m, nil
	}
	funcs["toYaml"] = func(v any) (string, error) {
		data, err := yaml.Marshal(v)
		return strings.TrimSuffix(string(data), "\n"), err
	}
	var n int
	funcs["include"] = func(name string, data any) (string, error) {
		var b bytes.Buffer
		err := tmpl.ExecuteTemplate(&b, name, data)
		return b.String(), err
	}
	funcs["tpl"] = func(text string, data any) (string, error) {
		mu.Lock()
		n++
		name := fmt.Sprintf("tpl-%d", n)
		mu.Unlock()
		if _, err := tmpl.New(name).Parse(text); err != nil {
			return "", err
		}
		var b bytes.Buffer
		err := tmpl.ExecuteTemplate(&b, name, data)
		return b.String(), err
	}
	tmpl.Funcs(funcs)
	main, err := os.ReadFile(filepath.Join(root, "werf.yaml"))
	require.NoError(t, err)
	if _, err := tmpl.Parse(string(main)); err != nil {
		return rendered{}, fmt.Errorf("parsing werf.yaml: %w", err)
	}
	data := map[string]any{
		"Files":  files{root: root, baseImages: baseImages},
		"Env":    "",
		"Commit": map[string]any{"Hash": strings.Repeat("0", 40)},
	}
	var out bytes.Buffer
	if err := tmpl.ExecuteTemplate(&out, "werf.yaml", data); err != nil {
		return rendered{}, err
	}
	var r rendered
	for _, doc := range regexp.MustCompile(`(?m)^---[ \t]*$`).Split(out.String(), -1) {
		m := map[string]any{}
		if err := yaml.Unmarshal([]byte(doc), &m); err != nil {
			return rendered{}, fmt.Errorf("werf.yaml renders a document that is not YAML: %w\n%s", err, doc)
		}
		if len(m) > 0 {
			r.docs = append(r.docs, m)
		}
	}
	for name := range read {
		r.envs = append(r.envs, name)
	}
	sort.Strings(r.envs)
	return r, nil
}

// meta is werf.yaml's first document (project, configVersion).
func (r rendered) meta() map[string]any {
	for _, d := range r.docs {
		if _, ok := d["project"]; ok {
			return d
		}
	}
	return nil
}

// image is the document of the image named name, or nil.
func (r rendered) image(name string) map[string]any {
	for _, d := range r.docs {
		if d["image"] == name {
			return d
		}
	}
	return nil
}

// images are the names of every image, sorted.
func (r rendered) images() []string {
	var out []string
	for _, d := range r.docs {
		if name, ok := d["image"].(string); ok {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

// finals are the images werf publishes (final is not false), sorted.
func (r rendered) finals() []string {
	var out []string
	for _, d := range r.docs {
		name, ok := d["image"].(string)
		if ok && d["final"] != false {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

// baseImageKeys are the base images the werf files ask base_images.yml for.
var baseImageKeys = []string{"builder/golang", "builder/alpine", "base/distroless", "builder/scratch"}

// testRegistry is the REGISTRY_PATH of the test's base_images.yml.
const testRegistry = "base-images.example.com/deckhouse/base_images"

// testDigest is a stand-in digest for a test base image: the sha256 of its key, not the digest
// of any real image.
func testDigest(key string) string {
	return fmt.Sprintf("sha256:%x", sha256.Sum256([]byte(key)))
}

// baseImagesYAML is a base_images.yml with every key the werf files need.
func baseImagesYAML(t *testing.T, change func(map[string]any)) []byte {
	t.Helper()
	m := map[string]any{"REGISTRY_PATH": testRegistry + "/"}
	for _, k := range baseImageKeys {
		m[k] = testDigest(k)
	}
	if change != nil {
		change(m)
	}
	data, err := yaml.Marshal(m)
	require.NoError(t, err)
	return data
}

// gitFiles lists the files git has (tracked, or new and not ignored) under the include paths,
// which is what werf's git directive takes from the commit.
func gitFiles(t *testing.T, root string, includePaths []string) []string {
	t.Helper()
	cmd := exec.Command("git", append([]string{"ls-files", "-z", "--cached", "--others", "--exclude-standard", "--"}, includePaths...)...)
	cmd.Dir = root
	out, err := cmd.Output()
	require.NoError(t, err, "git ls-files")
	var files []string
	for _, f := range strings.Split(strings.TrimRight(string(out), "\x00"), "\x00") {
		if f == "" {
			continue
		}
		if _, err := os.Stat(filepath.Join(root, f)); err != nil {
			continue // deleted in the work tree, not committed yet
		}
		files = append(files, f)
	}
	return files
}

// copyPaths copies the git files under includePaths from root into dir, keeping their paths
// and modes.
func copyPaths(t *testing.T, root, dir string, includePaths []string) {
	t.Helper()
	files := gitFiles(t, root, includePaths)
	require.NotEmpty(t, files, "the include paths %v name files", includePaths)
	for _, f := range files {
		src := filepath.Join(root, f)
		st, err := os.Stat(src)
		require.NoError(t, err)
		data, err := os.ReadFile(src)
		require.NoError(t, err)
		dst := filepath.Join(dir, f)
		require.NoError(t, os.MkdirAll(filepath.Dir(dst), 0o755))
		require.NoError(t, os.WriteFile(dst, data, st.Mode().Perm()))
	}
}

// strs converts a YAML list to strings.
func strs(v any) []string {
	list, _ := v.([]any)
	out := make([]string, 0, len(list))
	for _, x := range list {
		out = append(out, fmt.Sprint(x))
	}
	return out
}

// maps converts a YAML list of objects.
func maps(v any) []map[string]any {
	list, _ := v.([]any)
	out := make([]map[string]any, 0, len(list))
	for _, x := range list {
		if m, ok := x.(map[string]any); ok {
			out = append(out, m)
		}
	}
	return out
}
