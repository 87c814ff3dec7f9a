// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package upgrade_test

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"

	"github.com/deckhouse/service-with-healthchecks/testkit/stack"
)

// release is one release recorded in CHANGELOG.md.
type release struct {
	// Version is "0.1.0" (the heading without its "v").
	Version string
	// Commit is the recorded commit the release was cut from, as written (abbreviated or not).
	Commit string
}

var (
	releaseHeading = regexp.MustCompile(`^## v(\d+\.\d+\.\d+)\s*$`)
	commitLine     = regexp.MustCompile("^Commit:\\s*`?([0-9a-fA-F]{7,40})`?\\s*$")
)

// parseReleases reads the releases of a CHANGELOG.md, in file order (newest first): every
// `## vX.Y.Z` heading with the `Commit:` line of its section. Other headings (Unreleased) end a
// section and are not releases. A release heading without a commit line is an error: the record
// would not say what to build.
func parseReleases(changelog []byte) ([]release, error) {
	var out []release
	var cur *release
	flush := func() error {
		if cur == nil {
			return nil
		}
		if cur.Commit == "" {
			return fmt.Errorf("release v%s records no `Commit:` line", cur.Version)
		}
		out = append(out, *cur)
		cur = nil
		return nil
	}
	sc := bufio.NewScanner(bytes.NewReader(changelog))
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "## ") {
			if err := flush(); err != nil {
				return nil, err
			}
			if m := releaseHeading.FindStringSubmatch(line); m != nil {
				cur = &release{Version: m[1]}
			}
			continue
		}
		if m := commitLine.FindStringSubmatch(line); m != nil && cur != nil && cur.Commit == "" {
			cur.Commit = strings.ToLower(m[1])
		}
	}
	if err := flush(); err != nil {
		return nil, err
	}
	return out, nil
}

// previousRelease is the newest of releases (newest first) that is not HEAD itself: the first
// whose programs differ from HEAD's (isHead false). A release cut from HEAD, or HEAD being that
// release's own release commit (which changes only the release record), is skipped.
func previousRelease(releases []release, isHead func(release) (bool, error)) (release, error) {
	for _, r := range releases {
		same, err := isHead(r)
		if err != nil {
			return release{}, err
		}
		if !same {
			return r, nil
		}
	}
	return release{}, errors.New("CHANGELOG.md records no release below HEAD")
}

// releaseRecordFiles are the files a release commit changes (hack/release.sh): a release whose
// commit differs from HEAD only in them is HEAD.
var releaseRecordFiles = []string{"CHANGELOG.md", "Chart.yaml", "changelog.yaml"}

// git runs git in the repository and returns its trimmed standard output.
func git(root string, args ...string) (string, error) {
	cmd := exec.Command("git", append([]string{"-C", root}, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("git %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return strings.TrimSpace(string(out)), nil
}

// errNotInClone is the error of a release commit this clone does not have.
var errNotInClone = errors.New("not in this clone")

// resolveCommit is the full hash of a release's commit; it fails with what to fetch when the
// clone does not have it (a shallow clone).
func resolveCommit(root string, r release) (string, error) {
	full, err := git(root, "rev-parse", "--verify", "--quiet", r.Commit+"^{commit}")
	if err == nil && full != "" {
		return full, nil
	}
	shallow, _ := git(root, "rev-parse", "--is-shallow-repository")
	return "", fmt.Errorf("%w: the commit %s of release v%s (CHANGELOG.md) is not in this clone (shallow: %s); "+
		"the upgrade test builds that release from it: fetch the history with `git fetch --unshallow` "+
		"(or at least `git fetch origin %s`), or clone without --depth", errNotInClone, r.Commit, r.Version, shallow, r.Commit)
}

// isHeadRelease tells whether release r is HEAD: its commit differs from HEAD in nothing but the
// release record.
func isHeadRelease(root string) func(release) (bool, error) {
	return func(r release) (bool, error) {
		full, err := resolveCommit(root, r)
		if err != nil {
			return false, err
		}
		args := []string{"diff", "--quiet", full, "HEAD", "--", "."}
		for _, f := range releaseRecordFiles {
			args = append(args, ":(exclude)"+f)
		}
		cmd := exec.Command("git", append([]string{"-C", root}, args...)...)
		err = cmd.Run()
		var exit *exec.ExitError
		switch {
		case err == nil:
			return true, nil
		case errors.As(err, &exit) && exit.ExitCode() == 1:
			return false, nil
		default:
			return false, fmt.Errorf("git %s: %w", strings.Join(args, " "), err)
		}
	}
}

// builtRelease is a release built into the tool cache.
type builtRelease struct {
	release
	// FullCommit is the commit's full hash.
	FullCommit string
	// Dir is the release's cache folder: src/ (the commit's files), bin/ (its programs).
	Dir string
}

// Src is the release's source tree (its crds/, chart, docs/examples).
func (b builtRelease) Src() string { return filepath.Join(b.Dir, "src") }

// Binaries are the release's controller and agent.
func (b builtRelease) Binaries() stack.Binaries {
	return stack.Binaries{Controller: filepath.Join(b.Dir, "bin", "controller"), Agent: filepath.Join(b.Dir, "bin", "agent")}
}

// cacheRoot is tools/build.sh's cache root: $SWH_TOOLS_CACHE, else
// $XDG_CACHE_HOME/service-with-healthchecks, else $HOME/.cache/service-with-healthchecks.
func cacheRoot() (string, error) {
	if d := os.Getenv("SWH_TOOLS_CACHE"); d != "" {
		return d, nil
	}
	if d := os.Getenv("XDG_CACHE_HOME"); d != "" {
		return filepath.Join(d, "service-with-healthchecks"), nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", fmt.Errorf("finding the tool cache: %w", err)
	}
	return filepath.Join(home, ".cache", "service-with-healthchecks"), nil
}

// buildRelease builds release r (the commit's own hack/build-images.sh, static and trimmed, as
// its images are built) into the tool cache folder release-<version>-<commit>/, once: a
// `.complete` marker says it is done, and a lock file keeps two test binaries from building it
// side by side. The commit's files come from `git archive`, so no worktree is left behind.
func buildRelease(root string, r release) (builtRelease, error) {
	full, err := resolveCommit(root, r)
	if err != nil {
		return builtRelease{}, err
	}
	cache, err := cacheRoot()
	if err != nil {
		return builtRelease{}, err
	}
	name := "release-" + r.Version + "-" + full[:12]
	b := builtRelease{release: r, FullCommit: full, Dir: filepath.Join(cache, name)}
	if err := os.MkdirAll(cache, 0o755); err != nil {
		return b, err
	}
	lock, err := os.OpenFile(filepath.Join(cache, "."+name+".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return b, err
	}
	defer func() { _ = lock.Close() }()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return b, fmt.Errorf("locking the release cache: %w", err)
	}
	if _, err := os.Stat(filepath.Join(b.Dir, ".complete")); err == nil {
		return b, nil
	}
	tmp, err := os.MkdirTemp(cache, "."+name+".")
	if err != nil {
		return b, err
	}
	defer func() { _ = os.RemoveAll(tmp) }()
	if err := unpackAndBuild(root, b, tmp); err != nil {
		return b, err
	}
	if err := os.WriteFile(filepath.Join(tmp, ".complete"), nil, 0o644); err != nil {
		return b, err
	}
	_ = os.RemoveAll(b.Dir)
	if err := os.Rename(tmp, b.Dir); err != nil {
		return b, fmt.Errorf("moving the built release into the cache: %w", err)
	}
	return b, nil
}

// unpackAndBuild puts the commit's files into dir/src and its programs into dir/bin.
func unpackAndBuild(root string, b builtRelease, dir string) error {
	src := filepath.Join(dir, "src")
	if err := os.MkdirAll(src, 0o755); err != nil {
		return err
	}
	archive := exec.Command("sh", "-c", `git -C "$1" archive --format=tar "$2" | tar -x -C "$3"`, "sh", root, b.FullCommit, src)
	if out, err := archive.CombinedOutput(); err != nil {
		return fmt.Errorf("unpacking %s: %w: %s", b.FullCommit, err, out)
	}
	build := exec.Command("bash", filepath.Join(src, "hack", "build-images.sh"), "--out", filepath.Join(dir, "bin"), "controller", "agent")
	build.Dir = src
	// The release's own build: each module alone (the script sets GOWORK=off), its go.mod's
	// versions (from the module proxy when the module cache lacks them), its version stamped
	// where its script knows how.
	build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=-trimpath", "SWH_VERSION="+b.Version, "SWH_REVISION="+b.FullCommit[:12])
	if out, err := build.CombinedOutput(); err != nil {
		return fmt.Errorf("building release v%s (%s) with its hack/build-images.sh: %w:\n%s", b.Version, b.FullCommit[:12], err, out)
	}
	return nil
}
