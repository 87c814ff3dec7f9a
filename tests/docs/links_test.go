// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package docs

import (
	"regexp"
	"strings"
	"testing"
	"unicode"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var (
	mdLink  = regexp.MustCompile(`\]\(([A-Za-z0-9_.-]+\.md)(#[^)]*)?\)`)
	heading = regexp.MustCompile(`(?m)^#{1,6} +(.+?) *$`)
	// fenced code, whose "# comments" are not headings.
	fenced = regexp.MustCompile("(?ms)^ *```.*?^ *```")
)

// anchor is the GitHub anchor of a heading: lowercase, punctuation dropped, spaces to '-'.
func anchor(h string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(h) {
		switch {
		case unicode.IsLetter(r) || unicode.IsDigit(r) || r == '-' || r == '_':
			b.WriteRune(r)
		case r == ' ':
			b.WriteRune('-')
		}
	}
	return b.String()
}

func TestAnchorsFollowGitHub(t *testing.T) {
	cases := map[string]struct{ heading, want string }{
		"an English heading":    {"Migrating a live Service without downtime", "migrating-a-live-service-without-downtime"},
		"backticks are dropped": {"`spec.healthcheck`", "spechealthcheck"},
	}
	for _, a := range readRussianData(t).Anchors {
		cases[a.Name] = struct{ heading, want string }{a.Heading, a.Anchor}
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			assert.Equal(t, tc.want, anchor(tc.heading))
		})
	}
}

func TestEveryLinkBetweenPagesPointsToAPageAndHeadingThatExist(t *testing.T) {
	names, err := markdownFiles()
	require.NoError(t, err)
	anchors := map[string]map[string]bool{}
	pages := map[string]string{}
	for _, n := range names {
		md, err := readDoc(n)
		require.NoError(t, err)
		pages[n] = string(md)
		anchors[n] = map[string]bool{}
		for _, m := range heading.FindAllStringSubmatch(fenced.ReplaceAllString(string(md), ""), -1) {
			anchors[n][anchor(m[1])] = true
		}
	}
	links := 0
	for _, n := range names {
		for _, m := range mdLink.FindAllStringSubmatch(pages[n], -1) {
			links++
			target, frag := m[1], strings.TrimPrefix(m[2], "#")
			if !assert.Contains(t, anchors, target, "docs/%s links to %s, which does not exist", n, target) {
				continue
			}
			if frag != "" {
				assert.True(t, anchors[target][frag], "docs/%s links to %s#%s, which has no such heading", n, target, frag)
			}
		}
	}
	assert.Positive(t, links, "the pages link to each other")
}
