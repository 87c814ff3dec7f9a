// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"fmt"
	"sync"
	"time"
)

// While the demo starts it prints one line per step with the time it took; a step that takes a
// while says first what it is doing and then, now and again, that it still is, so that the
// terminal is never silent for long (development/RUN.md, "Starting").
const (
	// stepNotice is how long a step runs before it says what it is doing.
	stepNotice = 2 * time.Second
	// stepHeartbeat is how often a long step then says that it still runs.
	stepHeartbeat = 15 * time.Second
)

// progress prints one line of the demo's own (not the view), safe from any goroutine.
func (d *demo) progress(format string, args ...any) {
	d.outMu.Lock()
	defer d.outMu.Unlock()
	_, _ = fmt.Fprintf(d.cfg.Out, "swh-run: "+format+"\n", args...)
}

// step runs one start-up step: doing says what it does ("building the controller and the
// agent"), fn does it and returns what was done ("built the controller and the agent"), which is
// printed with the time it took.
func (d *demo) step(doing string, fn func() (string, error)) error {
	start := time.Now()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTimer(stepNotice)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				d.progress("%s ... (%s so far)", doing, time.Since(start).Truncate(time.Second))
				t.Reset(stepHeartbeat)
			}
		}
	})
	done, err := fn()
	close(stop)
	wg.Wait()
	if err != nil {
		return err
	}
	d.progress("%s (%s)", done, tookString(time.Since(start)))
	return nil
}

// tookString is a step's duration as the progress lines show it: "0.4s", "12.3s", "1m5s".
func tookString(t time.Duration) string {
	if t >= time.Minute {
		return t.Truncate(time.Second).String()
	}
	return fmt.Sprintf("%.1fs", t.Seconds())
}
