// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package docs

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/deckhouse/service-with-healthchecks/testkit/controlplane"
)

// yamlBlock is one fenced ```yaml block of a page.
type yamlBlock struct {
	// Line is the line of the opening fence (1-based).
	Line int
	// Text is the content between the fences.
	Text string
}

// docsDir is the repository's docs folder.
func docsDir() (string, error) {
	root, err := controlplane.RepoRoot()
	if err != nil {
		return "", fmt.Errorf("finding the repository root: %w", err)
	}
	return filepath.Join(root, "docs"), nil
}

// markdownFiles lists docs/*.md by base name, sorted.
func markdownFiles() ([]string, error) {
	dir, err := docsDir()
	if err != nil {
		return nil, err
	}
	paths, err := filepath.Glob(filepath.Join(dir, "*.md"))
	if err != nil {
		return nil, fmt.Errorf("listing %s: %w", dir, err)
	}
	names := make([]string, 0, len(paths))
	for _, p := range paths {
		names = append(names, filepath.Base(p))
	}
	sort.Strings(names)
	return names, nil
}

// readDoc reads docs/<name>.
func readDoc(name string) ([]byte, error) {
	dir, err := docsDir()
	if err != nil {
		return nil, err
	}
	b, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		return nil, fmt.Errorf("reading docs/%s: %w", name, err)
	}
	return b, nil
}

// yamlBlocks returns the ```yaml blocks of a markdown page.
func yamlBlocks(md []byte) ([]yamlBlock, error) {
	var (
		blocks []yamlBlock
		cur    *yamlBlock
		buf    strings.Builder
		fence  string
	)
	sc := bufio.NewScanner(bytes.NewReader(md))
	sc.Buffer(make([]byte, 0, 64*1024), 1024*1024)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		trimmed := strings.TrimSpace(line)
		switch {
		case cur == nil && fence == "" && strings.HasPrefix(trimmed, "```"):
			fence = "```"
			if lang := strings.TrimSpace(strings.TrimPrefix(trimmed, "```")); lang == "yaml" || lang == "yml" {
				cur = &yamlBlock{Line: n}
				buf.Reset()
			}
		case fence != "" && trimmed == "```":
			if cur != nil {
				cur.Text = buf.String()
				blocks = append(blocks, *cur)
				cur = nil
			}
			fence = ""
		case cur != nil:
			buf.WriteString(line)
			buf.WriteByte('\n')
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("scanning markdown: %w", err)
	}
	if fence != "" {
		return nil, fmt.Errorf("a code fence is never closed")
	}
	return blocks, nil
}
