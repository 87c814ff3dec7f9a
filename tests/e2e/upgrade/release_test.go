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

// previousRelease is the newest of releases (newest first) whose product differs from HEAD's
// (sameProduct false): HEAD's own release, or any release cut after only tests, tools or docs
// changed, is passed over, so the upgrade from it crosses a code change.
func previousRelease(releases []release, sameProduct func(release) (bool, error)) (release, error) {
	for _, r := range releases {
		same, err := sameProduct(r)
		if err != nil {
			return release{}, err
		}
		if !same {
			return r, nil
		}
	}
	return release{}, errors.New("CHANGELOG.md records no release whose product differs from HEAD's")
}

// upgradeSources are the releases the upgrade test starts from: the newest whose product
// differs from HEAD's (previousRelease) and the oldest recorded (the oldest supported), once
// when they are the same release. The oldest must differ from HEAD's product too.
func upgradeSources(releases []release, sameProduct func(release) (bool, error)) ([]release, error) {
	prev, err := previousRelease(releases, sameProduct)
	if err != nil {
		return nil, err
	}
	oldest := releases[len(releases)-1]
	if oldest == prev {
		return []release{prev}, nil
	}
	same, err := sameProduct(oldest)
	if err != nil {
		return nil, err
	}
	if same {
		return nil, fmt.Errorf("the oldest release v%s has HEAD's product while v%s does not: CHANGELOG.md is out of order", oldest.Version, prev.Version)
	}
	return []release{prev, oldest}, nil
}

// productPaths are what a release ships: the images' programs, the chart's templates, the
// CRDs, the hooks, the API and library modules and the settings' schema. Two commits that do
// not differ in them run the same product (tests, tools, docs and the release record aside).
var productPaths = []string{"images", "templates", "crds", "hooks", "api", "lib", "openapi"}

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

// resolveCommit is the full hash of a release's commit. When the clone lacks it (a shallow
// clone, a clone without tags) it fetches it from the clone's remote: the release's tag, then
// the history (--unshallow in a shallow clone); without a remote, or when that fails, the error
// says what to fetch. The upgrade test never skips for it.
func resolveCommit(root string, r release) (string, error) {
	if full, err := commitOf(root, r.Commit); err == nil {
		return full, nil
	}
	var tried []string
	remotes, _ := git(root, "remote")
	if remote, _, _ := strings.Cut(remotes, "\n"); remote != "" {
		fetches := [][]string{{"fetch", "--quiet", remote, "tag", "v" + r.Version}}
		if shallow, _ := git(root, "rev-parse", "--is-shallow-repository"); shallow == "true" {
			fetches = append(fetches, []string{"fetch", "--quiet", "--unshallow", remote})
		} else {
			fetches = append(fetches, []string{"fetch", "--quiet", remote})
		}
		for _, args := range fetches {
			_, err := git(root, args...)
			if err != nil {
				tried = append(tried, err.Error())
			} else {
				tried = append(tried, "git "+strings.Join(args, " ")+": done")
			}
			if full, err := commitOf(root, r.Commit); err == nil {
				return full, nil
			}
		}
	} else {
		tried = append(tried, "the clone has no remote to fetch from")
	}
	shallow, _ := git(root, "rev-parse", "--is-shallow-repository")
	return "", fmt.Errorf("%w: the commit %s of release v%s (CHANGELOG.md) is not in this clone (shallow: %s; %s); "+
		"the upgrade test builds that release from it: fetch the history with `git fetch --unshallow` "+
		"(or at least `git fetch origin %s`, or the tag v%s), or clone without --depth",
		errNotInClone, r.Commit, r.Version, shallow, strings.Join(tried, "; "), r.Commit, r.Version)
}

// commitOf is the full hash of a commit the clone has.
func commitOf(root, commit string) (string, error) {
	full, err := git(root, "rev-parse", "--verify", "--quiet", commit+"^{commit}")
	if err != nil || full == "" {
		return "", fmt.Errorf("no commit %s: %w", commit, err)
	}
	return full, nil
}

// errNotInClone is the error of a release commit this clone does not have and could not fetch.
var errNotInClone = errors.New("not in this clone")

// sameProduct tells whether release r ships HEAD's product: its commit and HEAD do not differ
// in productPaths.
func sameProduct(root string) func(release) (bool, error) {
	return func(r release) (bool, error) {
		full, err := resolveCommit(root, r)
		if err != nil {
			return false, err
		}
		args := append([]string{"diff", "--quiet", full, "HEAD", "--"}, productPaths...)
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
