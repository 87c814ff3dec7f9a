// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package werf

import (
	"debug/elf"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/deckhouse/service-with-healthchecks/tests/internal/bundle"
)

// programImages are the module's images and what each runs.
var programImages = map[string]string{"controller": "/controller", "agent": "/agent"}

func TestEveryBaseImageComesFromBaseImagesByDigest(t *testing.T) {
	r, err := renderWerf(t, baseImagesYAML(t, nil), nil)
	require.NoError(t, err)
	require.NotNil(t, r.meta(), "werf.yaml starts with project and configVersion")
	assert.Equal(t, "service-with-healthchecks", r.meta()["project"])

	want := map[string]string{
		"service-with-healthchecks/controller-artifact": "builder/golang",
		"service-with-healthchecks/agent-artifact":      "builder/golang",
		"service-with-healthchecks/hooks-artifact":      "builder/golang",
		"controller":                 "base/distroless",
		"agent":                      "base/distroless",
		"images-digests-and-version": "builder/alpine",
		"bundle":                     "builder/scratch",
		"release-channel-version":    "builder/scratch",
	}
	assert.ElementsMatch(t, slices.Collect(mapKeys(want)), r.images(), "the images werf builds")
	for _, d := range r.docs {
		name, ok := d["image"].(string)
		if !ok {
			continue
		}
		assert.NotContains(t, d, "fromImage", "%s starts from a base image, not from another image", name)
		key, known := want[name]
		if !known {
			continue
		}
		assert.Equal(t, testRegistry+"@"+testDigest(key), d["from"], "%s starts from %s, pinned by its digest", name, key)
	}
}

func mapKeys(m map[string]string) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

func TestBaseImagesYmlMistakesStopTheBuildWithTheKeyNamed(t *testing.T) {
	cases := map[string]struct {
		change  func(map[string]any)
		wantErr string
	}{
		"a tag instead of a digest": {
			change:  func(m map[string]any) { m["builder/golang"] = "1.26-bookworm" },
			wantErr: `base_images.yml: builder/golang must be a sha256 digest (sha256:<64 hex>), got "1.26-bookworm"`,
		},
		"a missing base image": {
			change:  func(m map[string]any) { delete(m, "base/distroless") },
			wantErr: "base_images.yml: base/distroless must be a sha256 digest",
		},
		"no registry path": {
			change:  func(m map[string]any) { delete(m, "REGISTRY_PATH") },
			wantErr: "base_images.yml: REGISTRY_PATH is not set",
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := renderWerf(t, baseImagesYAML(t, tc.change), nil)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.wantErr)
		})
	}
}

// TestWithoutBaseImagesYmlNothingCouldBePulled: dmt renders werf.yaml without the build's
// base_images.yml; the references then name the missing file under the reserved .invalid domain.
func TestWithoutBaseImagesYmlNothingCouldBePulled(t *testing.T) {
	r, err := renderWerf(t, nil, nil)
	require.NoError(t, err)
	seen := 0
	for _, d := range r.docs {
		if from, ok := d["from"].(string); ok {
			seen++
			assert.True(t, strings.HasPrefix(from, "base-images.invalid/base_images.yml-is-missing/"), "%s from %s", d["image"], from)
		}
	}
	assert.Equal(t, 8, seen, "every image starts from a base image")
}

func TestWerfReadsExactlyTheVariablesGiterminismAllows(t *testing.T) {
	r, err := renderWerf(t, baseImagesYAML(t, nil), nil)
	require.NoError(t, err)
	cfg, err := bundle.ReadYAML("werf-giterminism.yaml")
	require.NoError(t, err)
	rendering := cfg["config"].(map[string]any)["goTemplateRendering"].(map[string]any)
	assert.Equal(t, r.envs, sortedStrs(rendering["allowEnvVariables"]),
		"werf-giterminism.yaml allows exactly the variables the werf files read")
	assert.Equal(t, []string{baseImagesFile}, strs(rendering["allowUncommittedFiles"]))
	assert.Contains(t, r.envs, "MODULES_MODULE_TAG", "the variables were recorded")
}

func sortedStrs(v any) []string {
	s := strs(v)
	slices.Sort(s)
	return s
}

// TestImagesDigestsAndVersionAreWrittenForEveryPublishedImage runs the shell of the artifact
// that writes images_digests.json and version.json, with the digests werf would import.
func TestImagesDigestsAndVersionAreWrittenForEveryPublishedImage(t *testing.T) {
	r, err := renderWerf(t, baseImagesYAML(t, nil), map[string]string{"MODULES_MODULE_TAG": "v1.2.3"})
	require.NoError(t, err)
	art := r.image("images-digests-and-version")
	require.NotNil(t, art)
	assert.Equal(t, false, art["final"])

	programs := slices.Sorted(mapKeys(programImages))
	published := slices.DeleteFunc(r.finals(), func(n string) bool { return n == "bundle" || n == "release-channel-version" })
	assert.Equal(t, programs, published, "the images werf publishes beside the bundle are the programs'")

	env := []string{"PATH=" + os.Getenv("PATH")}
	var deps []string
	for _, dep := range maps(art["dependencies"]) {
		deps = append(deps, dep["image"].(string))
		imports := maps(dep["imports"])
		require.Len(t, imports, 1, dep["image"])
		assert.Equal(t, "ImageDigest", imports[0]["type"])
		assert.Equal(t, "MODULE_IMAGE_DIGEST_"+dep["image"].(string), imports[0]["targetEnv"])
		env = append(env, imports[0]["targetEnv"].(string)+"="+testDigest(dep["image"].(string)))
	}
	assert.ElementsMatch(t, programs, deps, "the artifact imports the digest of every published image")

	dir := t.TempDir()
	run := func(env []string) error {
		for _, cmd := range strs(art["shell"].(map[string]any)["setup"]) {
			cmd = strings.NewReplacer("/images_digests.json", dir+"/images_digests.json", "/version.json", dir+"/version.json").Replace(cmd)
			c := exec.Command("sh", "-c", cmd)
			c.Env = env
			if out, err := c.CombinedOutput(); err != nil {
				return fmt.Errorf("%s: %w: %s", cmd, err, out)
			}
		}
		return nil
	}
	require.NoError(t, run(env))
	var digests map[string]string
	data, err := os.ReadFile(filepath.Join(dir, "images_digests.json"))
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(data, &digests), "%s", data)
	assert.Equal(t, map[string]string{"controller": testDigest("controller"), "agent": testDigest("agent")}, digests)
	var version map[string]string
	data, err = os.ReadFile(filepath.Join(dir, "version.json"))
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(data, &version), "%s", data)
	assert.Equal(t, map[string]string{"version": "v1.2.3"}, version)

	// A digest werf did not import stops the build instead of writing an empty one.
	err = run(env[:len(env)-1])
	require.Error(t, err)
	assert.Contains(t, err.Error(), "no digest of image")
}

func TestTheBundleAndReleaseImagesCarryWhatDeckhouseReads(t *testing.T) {
	r, err := renderWerf(t, baseImagesYAML(t, nil), nil)
	require.NoError(t, err)

	b := r.image("bundle")
	require.NotNil(t, b)
	imports := maps(b["import"])
	require.Len(t, imports, 2)
	assert.Equal(t, "images-digests-and-version", imports[0]["image"])
	assert.ElementsMatch(t, []string{"images_digests.json", "version.json"}, strs(imports[0]["includePaths"]))
	assert.Equal(t, "service-with-healthchecks/hooks-artifact", imports[1]["image"])
	assert.Equal(t, "/hooks/go", imports[1]["to"], "the hooks binary sits where the crds hook looks from (../crds)")
	git := maps(b["git"])
	require.Len(t, git, 1)
	paths := strs(git[0]["includePaths"])
	for _, p := range []string{"Chart.yaml", ".helmignore", "module.yaml", "templates", "openapi", "crds", "docs", "monitoring"} {
		assert.Contains(t, paths, p, "the bundle has %s", p)
	}
	for _, p := range []string{"development", "tests", "hooks", "images"} {
		assert.NotContains(t, paths, p, "sources and developer documents stay out of the bundle")
	}

	rel := r.image("release-channel-version")
	require.NotNil(t, rel)
	relImports := maps(rel["import"])
	require.Len(t, relImports, 1)
	assert.Equal(t, "images-digests-and-version", relImports[0]["image"])
	assert.Equal(t, []string{"version.json"}, strs(relImports[0]["includePaths"]))
	relGit := maps(rel["git"])
	require.Len(t, relGit, 1)
	assert.Equal(t, []string{"module.yaml", "changelog.yaml"}, strs(relGit[0]["includePaths"]), "the release image carries module.yaml for its requirements and changelog.yaml for the ModuleRelease")
}

// TestTheBundleIsAWholeChartFromItsIncludePaths copies only what the bundle image takes from git
// and renders that copy as Deckhouse would, asking it for every image werf publishes by name.
func TestTheBundleIsAWholeChartFromItsIncludePaths(t *testing.T) {
	r, err := renderWerf(t, baseImagesYAML(t, nil), nil)
	require.NoError(t, err)
	root, err := bundle.Root()
	require.NoError(t, err)
	dir := t.TempDir()
	copyPaths(t, root, dir, strs(maps(r.image("bundle")["git"])[0]["includePaths"]))
	values, err := bundle.ValueSets()[bundle.SetDefaults].Values()
	require.NoError(t, err)
	objs, err := bundle.RenderDir(dir, values, nil, nil)
	require.NoError(t, err, "the bundle renders from its own files")
	counts := bundle.Objects(objs).Counts()
	assert.Equal(t, 1, counts["Deployment"])
	assert.Equal(t, 1, counts["DaemonSet"])
	assert.Positive(t, counts["PrometheusRule"], "the monitoring files are in the bundle")

	// The digests werf writes are the ones the templates ask for: without one, rendering fails
	// naming it.
	for name := range programImages {
		digests := values["global"].(map[string]any)["modulesImages"].(map[string]any)["digests"].(map[string]any)
		module := digests[bundle.ValuesKey].(map[string]any)
		saved := module[name]
		delete(module, name)
		_, err := bundle.RenderDir(dir, values, nil, nil)
		module[name] = saved
		require.Error(t, err, "the chart asks for the digest of %s", name)
		assert.Contains(t, err.Error(), "serviceWithHealthchecks."+name)
	}
}

// TestEachProgramImageBuildsFromOnlyItsIncludePaths copies, for every artifact, only the paths its
// git directive takes and runs its install shell there, as werf would; the binary the final
// image imports must come out, static.
func TestEachProgramImageBuildsFromOnlyItsIncludePaths(t *testing.T) {
	r, err := renderWerf(t, baseImagesYAML(t, nil), map[string]string{"GOPROXY": os.Getenv("GOPROXY")})
	require.NoError(t, err)
	root, err := bundle.Root()
	require.NoError(t, err)
	// What imports each artifact's output: the program images and the bundle.
	wants := map[string][]string{}
	for _, d := range r.docs {
		for _, imp := range maps(d["import"]) {
			if from, ok := imp["image"].(string); ok && strings.HasSuffix(from, "-artifact") {
				wants[from] = append(wants[from], imp["add"].(string))
			}
		}
	}
	require.Len(t, wants, 3, "the controller, agent and hooks artifacts are imported")
	for artifact, outputs := range wants {
		t.Run(artifact, func(t *testing.T) {
			d := r.image(artifact)
			require.NotNil(t, d)
			git := maps(d["git"])
			require.Len(t, git, 1)
			to := git[0]["to"].(string)
			work := t.TempDir()
			src := filepath.Join(work, "src")
			copyPaths(t, root, src, strs(git[0]["includePaths"]))
			out := filepath.Join(work, "out")
			replacer := strings.NewReplacer(to, src, "/out", out)
			cmds := strs(d["shell"].(map[string]any)["install"])
			require.NotEmpty(t, cmds)
			for _, cmd := range cmds {
				require.Contains(t, cmd, "hack/build-images.sh", "the image builds with the script CI runs")
				c := exec.Command("bash", "-c", replacer.Replace(cmd))
				c.Env = append(os.Environ(), "GOWORK=off")
				output, err := c.CombinedOutput()
				require.NoError(t, err, "building %s from its include paths only:\n%s", artifact, output)
			}
			for _, add := range outputs {
				bin := replacer.Replace(add)
				st, err := os.Stat(bin)
				require.NoError(t, err, "%s produces %s", artifact, add)
				assert.NotZero(t, st.Mode()&0o111, "%s is executable", add)
				f, err := elf.Open(bin)
				require.NoError(t, err, "%s is an ELF binary", add)
				for _, p := range f.Progs {
					assert.NotEqual(t, elf.PT_INTERP, p.Type, "%s is static: it runs on a distroless or empty base", add)
				}
				require.NoError(t, f.Close())
			}
		})
	}
}
