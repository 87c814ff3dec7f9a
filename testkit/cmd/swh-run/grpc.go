// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/deckhouse/service-with-healthchecks/testkit/cluster"
	"github.com/deckhouse/service-with-healthchecks/testkit/grpchealth"
)

// The gRPC part of the demo: resource orders (docs/examples/grpc.yaml) over the pods orders-0
// (node-a) and orders-1 (node-b), each with a real grpc-go health server on grpcPort and an HTTP
// server on webPort (development/RUN.md).
const (
	grpcFile     = "docs/examples/grpc.yaml"
	grpcResource = "orders"
	grpcPort     = 9090
	// grpcService is the health service name the example's probe asks about.
	grpcService = "shop.orders.v1.Orders"
	// podServicePrefix names, in each server's health service, a service "pod/<name>": the
	// traffic loop's List call learns from it which pod answered (kube-proxy hides the address).
	podServicePrefix = "pod/"
)

// addGRPCPods adds the pods of the gRPC example with their servers, every status SERVING.
func (d *demo) addGRPCPods(ctx context.Context) (string, error) {
	var done []string
	for i, n := range d.c.Nodes {
		p, err := d.c.NewPod(ctx, cluster.PodSpec{
			Namespace: demoNamespace, Name: fmt.Sprintf("%s-%d", grpcResource, i), Node: n.Name,
			Labels: map[string]string{"app": grpcResource},
			ContainerPorts: []corev1.ContainerPort{
				{Name: "grpc", ContainerPort: grpcPort, Protocol: corev1.ProtocolTCP},
				{Name: "rest", ContainerPort: webPort, Protocol: corev1.ProtocolTCP},
			},
		})
		if err != nil {
			return "", err
		}
		if _, err := p.Serve(cluster.HTTP, webPort); err != nil {
			return "", err
		}
		var ln net.Listener
		if err := p.InNetns(func() error {
			var lerr error
			ln, lerr = net.Listen("tcp", net.JoinHostPort(p.IP.String(), strconv.Itoa(grpcPort)))
			return lerr
		}); err != nil {
			return "", fmt.Errorf("listening for gRPC in pod %s: %w", p.Key(), err)
		}
		srv := grpchealth.Serve(ln, grpchealth.Options{})
		srv.Set(grpcService, grpchealth.Serving)
		srv.Set(podServicePrefix+p.Name, grpchealth.Serving)
		d.grpcPods = append(d.grpcPods, p)
		d.grpcServers = append(d.grpcServers, srv)
		done = append(done, p.Key()+" on "+p.Node)
	}
	return fmt.Sprintf("pods %s: gRPC health on %d (%s SERVING), HTTP on %d", strings.Join(done, ", "), grpcPort, grpcService, webPort), nil
}

// setGRPC makes orders-0's health service answer st for grpcService.
func (d *demo) setGRPC(st healthpb.HealthCheckResponse_ServingStatus) (string, error) {
	if len(d.grpcServers) == 0 {
		return "", errors.New("the demo has no gRPC servers")
	}
	d.grpcServers[0].Set(grpcService, st)
	return fmt.Sprintf("gRPC health of %s answers %s for %s", d.grpcPods[0].Name, st, grpcService), nil
}

// runGRPC sends one gRPC request through the ClusterIP on a new connection and waits for the
// next interval: a health List call, OK when the answering server says grpcService is SERVING
// (what a client of the orders service needs), its pod named by the server's "pod/<name>"
// service.
func (l *loop) runGRPC(ctx context.Context) {
	l.runOne(ctx, loopInterval, func(ip string) (string, error) {
		return grpcRequest(ctx, net.JoinHostPort(ip, strconv.Itoa(int(l.port))), loopTimeout, l.d.c.ClientDialer(loopTimeout))
	})
}

// grpcRequest calls the health service's List at addr on a new connection dialled by dc (the
// cluster's client dialer: from the traffic client's address).
func grpcRequest(ctx context.Context, addr string, timeout time.Duration, dc cluster.DialContext) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	conn, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) { return dc(ctx, "tcp", addr) }))
	if err != nil {
		return "", err
	}
	defer func() { _ = conn.Close() }()
	resp, err := healthpb.NewHealthClient(conn).List(ctx, &healthpb.HealthListRequest{})
	if err != nil {
		return "", err
	}
	pod := ""
	for name := range resp.GetStatuses() {
		if after, ok := strings.CutPrefix(name, podServicePrefix); ok {
			pod = demoNamespace + "/" + after
		}
	}
	if st := resp.GetStatuses()[grpcService].GetStatus(); st != grpchealth.Serving {
		return pod, fmt.Errorf("%s answers %s for %s", pod, st, grpcService)
	}
	return pod, nil
}
