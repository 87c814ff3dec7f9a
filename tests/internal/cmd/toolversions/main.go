// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

// Command toolversions keeps the tool groups that make test builds (tools/kube) on the same
// versions of the modules they share with the product's modules, so that one compiled copy of
// Kubernetes' client libraries, gRPC, protobuf and golang.org/x serves the tools, the test binaries
// and the image builds (development/TEST-HARNESS.md, "One build configuration"). A package is
// compiled once per version and build configuration: with two versions of golang.org/x/net in
// play, everything above it (client-go, apimachinery, …) is compiled twice on a fresh machine.
//
//	go run ./tests/internal/cmd/toolversions          raise every side to the highest version and tidy
//	go run ./tests/internal/cmd/toolversions -check   list the differences and exit 1 when there are any
//
// Run from the repository root. Only modules that provide a package both sides compile are
// compared: the rest of a build list never reaches the compiler.
package main

import (
	"bufio"
	"bytes"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"

	"golang.org/x/mod/modfile"
	"golang.org/x/mod/semver"
)

// side is one Go module whose compiled packages should be shared.
type side struct {
	dir  string   // relative to the repository root
	pkgs []string // the packages it builds (go list -deps patterns)
	tags string   // build tags of the tool group (tools/<group>/build-flags)
	test bool     // include the packages' tests
}

func main() {
	check := flag.Bool("check", false, "only report the differences; exit 1 when there are any")
	flag.Parse()
	sides, err := discover()
	if err != nil {
		fail(err)
	}
	for round := 0; round < 5; round++ {
		used, err := collect(sides)
		if err != nil {
			fail(err)
		}
		raises := plan(sides, used)
		if len(raises) == 0 {
			fmt.Println("toolversions: the tools and the modules share every version they compile")
			return
		}
		if *check {
			report(raises)
			fmt.Fprintln(os.Stderr, "toolversions: run `go run ./tests/internal/cmd/toolversions` at the repository root")
			os.Exit(1)
		}
		if err := apply(raises); err != nil {
			fail(err)
		}
	}
	fail(fmt.Errorf("the versions did not settle in five rounds"))
}

// discover lists the workspace's modules (go.work), the standalone tests/monitoring and the tool
// group tools/kube (kube-rbac-proxy's group cannot join: it needs an older k8s.io/apiserver).
func discover() ([]side, error) {
	data, err := os.ReadFile("go.work")
	if err != nil {
		return nil, fmt.Errorf("run from the repository root: %w", err)
	}
	work, err := modfile.ParseWork("go.work", data, nil)
	if err != nil {
		return nil, err
	}
	var sides []side
	for _, u := range work.Use {
		sides = append(sides, side{dir: filepath.Clean(u.Path), pkgs: []string{"./..."}, test: true})
	}
	sides = append(sides, side{dir: "tests/monitoring", pkgs: []string{"./..."}, test: true})
	tools, tags, err := toolGroup("tools/kube")
	if err != nil {
		return nil, err
	}
	return append(sides, side{dir: "tools/kube", pkgs: tools, tags: tags}), nil
}

// toolGroup reads a tool group's tool lines and the build tags of its build-flags file.
func toolGroup(dir string) ([]string, string, error) {
	data, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	if err != nil {
		return nil, "", err
	}
	mod, err := modfile.Parse("go.mod", data, nil)
	if err != nil {
		return nil, "", err
	}
	var tools []string
	for _, t := range mod.Tool {
		tools = append(tools, t.Path)
	}
	var tags string
	if flags, err := os.ReadFile(filepath.Join(dir, "build-flags")); err == nil {
		for _, f := range strings.Fields(string(flags)) {
			if v, ok := strings.CutPrefix(f, "-tags="); ok {
				tags = v
			}
		}
	}
	return tools, tags, nil
}

// collect maps each side to the modules (path → version) whose packages it compiles.
func collect(sides []side) ([]map[string]string, error) {
	used := make([]map[string]string, len(sides))
	for i, s := range sides {
		args := []string{"list", "-deps", "-f", "{{with .Module}}{{if not .Main}}{{.Path}} {{.Version}}{{with .Replace}} {{.Version}}{{end}}{{end}}{{end}}"}
		if s.test {
			args = append(args, "-test")
		}
		if s.tags != "" {
			args = append(args, "-tags="+s.tags)
		}
		out, err := goCmd(s.dir, append(args, s.pkgs...)...)
		if err != nil {
			return nil, err
		}
		used[i] = map[string]string{}
		sc := bufio.NewScanner(bytes.NewReader(out))
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			if len(f) >= 2 {
				used[i][f[0]] = f[len(f)-1]
			}
		}
	}
	return used, nil
}

// raise is one module a side should require at a higher version.
type raise struct{ dir, path, from, to string }

// plan finds, for every module at least two sides compile, the highest version, and the sides
// below it. Comparing the product's modules among themselves too keeps each of them, built alone
// (GOWORK=off), on the versions the workspace selects.
func plan(sides []side, used []map[string]string) []raise {
	highest := map[string]string{}
	count := map[string]int{}
	for i := range sides {
		for path, v := range used[i] {
			count[path]++
			highest[path] = maxVersion(highest[path], v)
		}
	}
	shared := map[string]bool{}
	for path, n := range count {
		shared[path] = n > 1
	}
	var raises []raise
	for i, s := range sides {
		for path, v := range used[i] {
			if shared[path] && v != highest[path] {
				raises = append(raises, raise{s.dir, path, v, highest[path]})
			}
		}
	}
	sort.Slice(raises, func(a, b int) bool {
		if raises[a].dir != raises[b].dir {
			return raises[a].dir < raises[b].dir
		}
		return raises[a].path < raises[b].path
	})
	return raises
}

func maxVersion(a, b string) string {
	if a == "" || semver.Compare(b, a) > 0 {
		return b
	}
	return a
}

func report(raises []raise) {
	for _, r := range raises {
		fmt.Fprintf(os.Stderr, "toolversions: %s compiles %s %s, another side %s\n", r.dir, r.path, r.from, r.to)
	}
}

// apply raises each side with one go get and tidies it.
func apply(raises []raise) error {
	byDir := map[string][]string{}
	var dirs []string
	for _, r := range raises {
		if byDir[r.dir] == nil {
			dirs = append(dirs, r.dir)
		}
		byDir[r.dir] = append(byDir[r.dir], r.path+"@"+r.to)
	}
	for _, d := range dirs {
		fmt.Printf("toolversions: %s: go get %s\n", d, strings.Join(byDir[d], " "))
		if _, err := goCmd(d, append([]string{"get"}, byDir[d]...)...); err != nil {
			return err
		}
		if _, err := goCmd(d, "mod", "tidy"); err != nil {
			return err
		}
	}
	return nil
}

// goCmd runs the go command in dir alone (GOWORK=off: every module builds alone) with the tests'
// build configuration.
func goCmd(dir string, args ...string) ([]byte, error) {
	cmd := exec.Command("go", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOWORK=off", "CGO_ENABLED=0", "GOFLAGS=-mod=mod")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("%s: go %s: %w: %s", dir, strings.Join(args, " "), err, stderr.String())
	}
	return out, nil
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "toolversions:", err)
	os.Exit(1)
}
