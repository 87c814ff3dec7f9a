// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package cluster

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"strings"
	"time"
)

// KeptConn is one HTTP/1.1 keep-alive connection to an address: requests after the first go over
// the same connection, so they stay with the endpoint kube-proxy (or a load balancer) chose when
// it opened. The drain tests use it to show that an established connection keeps working.
type KeptConn struct {
	tr  *http.Transport
	hc  *http.Client
	url string
}

// NewKeptConn returns a client of addr that holds at most one connection; the first Get opens it.
func NewKeptConn(addr string) *KeptConn {
	tr := &http.Transport{Proxy: nil, MaxConnsPerHost: 1, MaxIdleConnsPerHost: 1, IdleConnTimeout: 5 * time.Minute,
		DialContext: (&net.Dialer{Timeout: 2 * time.Second}).DialContext}
	return &KeptConn{tr: tr, hc: &http.Client{Transport: tr, Timeout: 5 * time.Second}, url: "http://" + addr + "/"}
}

// Get sends one request and returns the pod that answered (the test server's body, at most
// 4 KiB read) and whether the connection was reused.
func (k *KeptConn) Get(ctx context.Context) (pod string, reused bool, err error) {
	trace := &httptrace.ClientTrace{GotConn: func(info httptrace.GotConnInfo) { reused = info.Reused }}
	req, err := http.NewRequestWithContext(httptrace.WithClientTrace(ctx, trace), http.MethodGet, k.url, nil)
	if err != nil {
		return "", false, err
	}
	resp, err := k.hc.Do(req)
	if err != nil {
		return "", reused, err
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if err != nil {
		return "", reused, err
	}
	if resp.StatusCode != http.StatusOK {
		return "", reused, fmt.Errorf("status %s", resp.Status)
	}
	return strings.TrimSpace(string(body)), reused, nil
}

// Close closes the connection.
func (k *KeptConn) Close() { k.tr.CloseIdleConnections() }
