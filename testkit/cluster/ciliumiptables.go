// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package cluster

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// toolsCache is the folder tools/build.sh and hack/deps.sh cache into: $SWH_TOOLS_CACHE, else
// $XDG_CACHE_HOME/service-with-healthchecks, else ~/.cache/service-with-healthchecks.
func toolsCache() string {
	if d := os.Getenv("SWH_TOOLS_CACHE"); d != "" {
		return d
	}
	base := os.Getenv("XDG_CACHE_HOME")
	if base == "" {
		home, _ := os.UserHomeDir()
		base = filepath.Join(home, ".cache")
	}
	return filepath.Join(base, "service-with-healthchecks")
}

// iptablesNames are the commands cilium-agent runs, all served by iptables' xtables-nft-multi.
var iptablesNames = []string{
	"iptables", "iptables-save", "iptables-restore", "ip6tables", "ip6tables-save", "ip6tables-restore",
	"iptables-nft", "iptables-nft-save", "iptables-nft-restore", "ip6tables-nft", "ip6tables-nft-save", "ip6tables-nft-restore",
}

// linkPrivateIptables links the iptables commands into pathDir from the Debian package that
// `hack/deps.sh --cilium` unpacks into the tools cache (cacheRoot/iptables-<version>), and
// returns its extensions folder (XTABLES_LIBDIR). Cilium needs ip6tables for IPv6 (without:
// "IPv6 is enabled, but the needed ip6tables tables are unavailable"); an iptables on the
// machine's PATH would make the real-node tests' kubelets create chains of their own.
func linkPrivateIptables(cacheRoot, pathDir string) (string, error) {
	found, _ := filepath.Glob(filepath.Join(cacheRoot, "iptables-*", "usr", "sbin", "xtables-nft-multi"))
	if len(found) == 0 {
		return "", fmt.Errorf("no private iptables in %s: run `hack/deps.sh --cilium` (make test-cilium does)", cacheRoot)
	}
	multi := found[len(found)-1]
	for _, name := range iptablesNames {
		if err := os.Symlink(multi, filepath.Join(pathDir, name)); err != nil {
			return "", fmt.Errorf("linking %s: %w", name, err)
		}
	}
	root := filepath.Dir(filepath.Dir(filepath.Dir(multi)))
	libs, _ := filepath.Glob(filepath.Join(root, "usr", "lib", "*", "xtables"))
	if len(libs) == 0 {
		return "", fmt.Errorf("no xtables extensions under %s", root)
	}
	return libs[0], nil
}

// nftTables lists the nftables tables of the cluster namespace ("ip filter", ...).
func nftTables() (map[string]bool, error) {
	out, err := exec.Command("nft", "list", "tables").CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("listing nftables tables: %w: %s", err, bytes.TrimSpace(out))
	}
	tables := map[string]bool{}
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if t, ok := strings.CutPrefix(strings.TrimSpace(l), "table "); ok {
			tables[t] = true
		}
	}
	return tables, nil
}

// deleteNewNftTables deletes the tables of the cluster namespace that are not in before.
func deleteNewNftTables(before map[string]bool) error {
	now, err := nftTables()
	if err != nil {
		return err
	}
	var errs []error
	for t := range now {
		if before[t] {
			continue
		}
		args := append([]string{"delete", "table"}, strings.Fields(t)...)
		if out, err := exec.Command("nft", args...).CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("nft delete table %s: %w: %s", t, err, bytes.TrimSpace(out)))
		}
	}
	return errors.Join(errs...)
}
