// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

// Package werf tests the module's build files without werf (which is not available here):
// werf.yaml and .werf/*.yaml are rendered with werf's template functions and a base_images.yml
// the test supplies, then checked for what the build and Deckhouse rely on:
//
//   - every image starts from a base image of base_images.yml, pinned by digest, and a mistake in
//     that file stops the build naming the key;
//   - werf-giterminism.yaml allows exactly the environment variables the werf files read;
//   - the artifact that writes images_digests.json and version.json is run (its shell, with the
//     digests werf would import): one digest per published image, the version from
//     MODULES_MODULE_TAG;
//   - the bundle image's git include paths alone make a chart that renders, asking for exactly the
//     digests werf writes; the release image carries version.json and module.yaml;
//   - each program's artifact builds its static binary from only its own include paths, with the
//     same hack/build-images.sh that CI runs;
//   - oss.yaml names the versions the images' go.mod files require.
//
// What only werf can prove (stage caching, imports between images, publishing, the final images'
// metadata) is listed in development/PACKAGING.md as not verified here.
package werf
