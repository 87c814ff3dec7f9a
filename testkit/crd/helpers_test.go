// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package crd_test

import "sigs.k8s.io/controller-runtime/pkg/client"

func keyOf(ns, name string) client.ObjectKey { return client.ObjectKey{Namespace: ns, Name: name} }
