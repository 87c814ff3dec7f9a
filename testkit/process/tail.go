// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package process

import (
	"io"
	"os"
)

// Tail returns the last limit bytes of a file, after a "[...]" line when it is longer; an error
// reading it is returned as the text.
func Tail(path string, limit int64) string {
	f, err := os.Open(path)
	if err != nil {
		return err.Error()
	}
	defer func() { _ = f.Close() }()
	st, err := f.Stat()
	if err != nil {
		return err.Error()
	}
	off := st.Size() - limit
	prefix := ""
	if off > 0 {
		prefix = "[...]\n"
	} else {
		off = 0
	}
	if _, err := f.Seek(off, io.SeekStart); err != nil {
		return err.Error()
	}
	b, err := io.ReadAll(f)
	if err != nil {
		return err.Error()
	}
	return prefix + string(b)
}

// tailString is Tail of a text held in memory.
func tailString(s string, limit int64) string {
	if int64(len(s)) <= limit {
		return s
	}
	return "[...]\n" + s[int64(len(s))-limit:]
}
