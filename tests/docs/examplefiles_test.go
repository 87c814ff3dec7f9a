// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package docs

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fileLink is a link to a file under docs/examples/ on the line before a yaml block.
var fileLink = regexp.MustCompile(`\]\((examples/[A-Za-z0-9_.-]+\.yaml)\)`)

// examplePages show the files of docs/examples/ (make run applies the same files).
var examplePages = []string{"EXAMPLES.md", "EXAMPLES.ru.md"}

// fileBlocks maps each yaml block of a page whose preceding non-empty line links to a file
// under docs/examples/ to that file's path (relative to docs/).
func fileBlocks(md []byte) (map[string][]yamlBlock, error) {
	blocks, err := yamlBlocks(md)
	if err != nil {
		return nil, err
	}
	lines := strings.Split(string(md), "\n")
	out := map[string][]yamlBlock{}
	for _, b := range blocks {
		prev := ""
		for i := b.Line - 2; i >= 0; i-- { // b.Line is 1-based: lines[b.Line-1] is the fence
			if strings.TrimSpace(lines[i]) != "" {
				prev = lines[i]
				break
			}
		}
		if m := fileLink.FindStringSubmatch(prev); m != nil {
			out[m[1]] = append(out[m[1]], b)
		}
	}
	return out, nil
}

// Every yaml block that names a file under docs/examples/ is that file byte for byte, and every
// such file is shown by both example pages: the docs show what `make run` applies.
func TestExampleBlocksAreTheirFilesVerbatim(t *testing.T) {
	dir, err := docsDir()
	require.NoError(t, err)
	files, err := filepath.Glob(filepath.Join(dir, "examples", "*.yaml"))
	require.NoError(t, err)
	require.NotEmpty(t, files, "docs/examples/ holds the example files")
	for _, page := range examplePages {
		md, err := readDoc(page)
		require.NoError(t, err)
		shown, err := fileBlocks(md)
		require.NoError(t, err)
		for _, f := range files {
			rel := "examples/" + filepath.Base(f)
			want, err := os.ReadFile(f)
			require.NoError(t, err)
			blocks := shown[rel]
			if !assert.Len(t, blocks, 1, "docs/%s shows docs/%s once, in a yaml block right after a line that links to it", page, rel) {
				continue
			}
			assert.Equal(t, string(want), blocks[0].Text, "docs/%s:%d must be docs/%s verbatim", page, blocks[0].Line, rel)
		}
		for rel := range shown {
			_, err := os.Stat(filepath.Join(dir, rel))
			assert.NoError(t, err, "docs/%s links a block to docs/%s, which does not exist", page, rel)
		}
	}
}

func TestTheFileBlockParserFindsTheLinkBeforeABlock(t *testing.T) {
	md := "Intro.\n\nThe Secret, [examples/a.yaml](examples/a.yaml):\n\n```yaml\nkind: A\n```\n\nNo link:\n\n```yaml\nkind: B\n```\n"
	got, err := fileBlocks([]byte(md))
	require.NoError(t, err)
	require.Len(t, got, 1)
	require.Len(t, got["examples/a.yaml"], 1)
	assert.Equal(t, "kind: A\n", got["examples/a.yaml"][0].Text)
	assert.Equal(t, 5, got["examples/a.yaml"][0].Line)
}
