// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package realnode

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path"
	"time"
)

// Image is a one-binary OCI image: the static binary at /<name>, its entrypoint.
type Image struct {
	// Ref is the image's name in containerd, e.g. "swh.test/pause:1".
	Ref string
	// Binary is the path of the static binary to pack.
	Binary string
	// Name is the binary's file name in the image (entrypoint /<Name>).
	Name string
}

// ociDescriptor is an OCI content descriptor (image-spec descriptor.md).
type ociDescriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int               `json:"size"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

const (
	mediaManifest = "application/vnd.oci.image.manifest.v1+json"
	mediaConfig   = "application/vnd.oci.image.config.v1+json"
	mediaLayer    = "application/vnd.oci.image.layer.v1.tar"
	mediaIndex    = "application/vnd.oci.image.index.v1+json"
)

// WriteArchive writes img as an OCI image layout in a tar archive (what `ctr images import`
// reads), byte for byte the same for the same binary: every time stamp is the epoch, every
// owner root. The standard library does it in these few lines; go-containerregistry is not in
// testkit's module graph and would bring its dependencies for five files.
func WriteArchive(img Image, dst string) error {
	bin, err := os.ReadFile(img.Binary)
	if err != nil {
		return fmt.Errorf("reading the image's binary: %w", err)
	}
	layer, err := layerTar(img.Name, bin)
	if err != nil {
		return err
	}
	layerDesc := describe(mediaLayer, layer)
	config, err := json.Marshal(map[string]any{
		"architecture": "amd64",
		"os":           "linux",
		"config":       map[string]any{"Entrypoint": []string{"/" + img.Name}},
		"rootfs":       map[string]any{"type": "layers", "diff_ids": []string{layerDesc.Digest}},
	})
	if err != nil {
		return err
	}
	configDesc := describe(mediaConfig, config)
	manifest, err := json.Marshal(map[string]any{
		"schemaVersion": 2, "mediaType": mediaManifest,
		"config": configDesc, "layers": []ociDescriptor{layerDesc},
	})
	if err != nil {
		return err
	}
	manifestDesc := describe(mediaManifest, manifest)
	manifestDesc.Annotations = map[string]string{"io.containerd.image.name": img.Ref}
	index, err := json.Marshal(map[string]any{
		"schemaVersion": 2, "mediaType": mediaIndex, "manifests": []ociDescriptor{manifestDesc},
	})
	if err != nil {
		return err
	}
	var out bytes.Buffer
	tw := tar.NewWriter(&out)
	files := []struct {
		name string
		data []byte
	}{
		{"oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)},
		{"index.json", index},
		{blobPath(manifestDesc), manifest},
		{blobPath(configDesc), config},
		{blobPath(layerDesc), layer},
	}
	for _, f := range files {
		if err := writeFile(tw, f.name, 0o644, f.data); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return os.WriteFile(dst, out.Bytes(), 0o644)
}

// layerTar is the image's one layer: the directories runc and the CRI plugin mount over and the
// binary.
func layerTar(name string, bin []byte) ([]byte, error) {
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, dir := range []string{"dev", "etc", "proc", "sys", "tmp"} {
		mode := int64(0o755)
		if dir == "tmp" {
			mode = 0o1777
		}
		hdr := &tar.Header{Typeflag: tar.TypeDir, Name: dir + "/", Mode: mode, ModTime: time.Unix(0, 0)}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, err
		}
	}
	if err := writeFile(tw, name, 0o755, bin); err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

func writeFile(tw *tar.Writer, name string, mode int64, data []byte) error {
	hdr := &tar.Header{
		Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: int64(len(data)), ModTime: time.Unix(0, 0),
	}
	if err := tw.WriteHeader(hdr); err != nil {
		return err
	}
	_, err := tw.Write(data)
	return err
}

func describe(mediaType string, data []byte) ociDescriptor {
	sum := sha256.Sum256(data)
	return ociDescriptor{MediaType: mediaType, Digest: "sha256:" + hex.EncodeToString(sum[:]), Size: len(data)}
}

func blobPath(d ociDescriptor) string {
	return path.Join("blobs", "sha256", d.Digest[len("sha256:"):])
}
