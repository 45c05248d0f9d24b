// Package image checks the container image's build without a Docker engine: it parses the
// Dockerfile's `go build` line, builds ./cmd/webhook-operator with exactly that environment
// and those flags, and checks that the binary is static, stripped, trimmed and version
// stamped, and that the Dockerfile and `make build` use the same flags.
package image

import (
	"archive/tar"
	"bytes"
	"debug/buildinfo"
	"debug/elf"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/webhook-operator/webhook-operator/internal/ociimage"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

const (
	module       = "github.com/webhook-operator/webhook-operator"
	versionVar   = module + "/internal/version.Version"
	testVersion  = "v0.0.0-imagetest"
	mainPackage  = "./cmd/webhook-operator"
	imageBinary  = "/webhook-operator"
	runtimeImage = "gcr.io/distroless/static"
)

// parseDockerfile reads the Dockerfile's instructions.
func parseDockerfile(t *testing.T, path string) []ociimage.Instruction {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	ins, err := ociimage.ParseDockerfile(b)
	if err != nil {
		t.Fatal(err)
	}
	return ins
}

// goBuild is the Dockerfile's `go build` command.
type goBuild struct {
	Env    []string // NAME=VALUE, as written (unexpanded)
	Flags  []string // the build flags, without -o
	Output string
	Pkg    string
}

// findGoBuild finds the one RUN instruction that runs `go build` and parses it.
func findGoBuild(t *testing.T, ins []ociimage.Instruction) goBuild {
	t.Helper()
	var runs []string
	for _, in := range ins {
		if in.Cmd == "RUN" && strings.Contains(in.Args, "go build") {
			runs = append(runs, in.Args)
		}
	}
	if len(runs) != 1 {
		t.Fatalf("want one RUN with go build in the Dockerfile, have %d", len(runs))
	}
	words, err := ociimage.ShellWords(runs[0])
	if err != nil {
		t.Fatal(err)
	}
	var b goBuild
	i := 0
	for ; i < len(words) && strings.HasPrefix(words[i], "--"); i++ { // RUN flags: --mount=...
	}
	for ; i < len(words) && regexp.MustCompile(`^[A-Z_][A-Z0-9_]*=`).MatchString(words[i]); i++ {
		b.Env = append(b.Env, words[i])
	}
	if i+1 >= len(words) || words[i] != "go" || words[i+1] != "build" {
		t.Fatalf("the RUN line is not `[VAR=value ...] go build ...`: %q", words)
	}
	rest := words[i+2:]
	if len(rest) == 0 {
		t.Fatal("go build without a package")
	}
	b.Pkg = rest[len(rest)-1]
	for j := 0; j < len(rest)-1; j++ {
		switch {
		case rest[j] == "-o" && j+1 < len(rest)-1:
			b.Output = rest[j+1]
			j++
		case rest[j] == "-ldflags" && j+1 < len(rest)-1:
			b.Flags = append(b.Flags, rest[j], rest[j+1])
			j++
		default:
			b.Flags = append(b.Flags, rest[j])
		}
	}
	return b
}

// expand substitutes build arguments the way the RUN line's shell would: ${NAME},
// ${NAME:-default} and $NAME. An argument the test does not know fails the test, so a new
// one in the Dockerfile is noticed here.
func expand(t *testing.T, s string, args map[string]string) string {
	t.Helper()
	return os.Expand(s, func(name string) string {
		name, def, hasDef := strings.Cut(name, ":-")
		v, ok := args[name]
		if !ok {
			t.Fatalf("the Dockerfile's build line uses $%s, which the test does not know", name)
		}
		if v == "" && hasDef {
			return def
		}
		return v
	})
}

// ldflags returns the value of -ldflags in flags.
func ldflags(flags []string) string {
	if i := slices.Index(flags, "-ldflags"); i >= 0 && i+1 < len(flags) {
		return flags[i+1]
	}
	return ""
}

func TestDockerfile(t *testing.T) {
	root := testenv.Root()
	ins := parseDockerfile(t, filepath.Join(root, "Dockerfile"))
	b := findGoBuild(t, ins)

	// The build line has the properties the image depends on.
	if !slices.Contains(b.Env, "CGO_ENABLED=0") {
		t.Errorf("build env %q: want CGO_ENABLED=0 for a static binary", b.Env)
	}
	if !slices.Contains(b.Flags, "-trimpath") {
		t.Errorf("build flags %q: want -trimpath", b.Flags)
	}
	ld := strings.Fields(ldflags(b.Flags))
	for _, want := range []string{"-s", "-w", "-X", versionVar + "=${VERSION}"} {
		if !slices.Contains(ld, want) {
			t.Errorf("-ldflags %q lacks %s", ld, want)
		}
	}
	if b.Pkg != mainPackage {
		t.Errorf("builds %s, want %s", b.Pkg, mainPackage)
	}

	// The runtime stage: distroless static, the built binary as the one ENTRYPOINT, non-root.
	var froms, entrypoints, users []string
	var copied bool
	for _, in := range ins {
		switch in.Cmd {
		case "FROM":
			froms = append(froms, in.Args)
		case "ENTRYPOINT":
			entrypoints = append(entrypoints, in.Args)
		case "USER":
			users = append(users, in.Args)
		case "COPY":
			copied = copied || in.Args == "--from=build "+b.Output+" "+imageBinary
		}
	}
	if len(froms) != 2 || !strings.HasPrefix(froms[len(froms)-1], runtimeImage) || !strings.HasSuffix(froms[len(froms)-1], ":nonroot") {
		t.Errorf("stages %q: want a build stage and %s...:nonroot", froms, runtimeImage)
	}
	if !copied {
		t.Errorf("no `COPY --from=build %s %s`: the image would not hold what was built", b.Output, imageBinary)
	}
	var ep []string
	if len(entrypoints) != 1 || json.Unmarshal([]byte(entrypoints[0]), &ep) != nil || !slices.Equal(ep, []string{imageBinary}) {
		t.Errorf("ENTRYPOINT %q: want exactly one, [%q] in exec form", entrypoints, imageBinary)
	}
	if len(users) != 1 || !regexp.MustCompile(`^[1-9][0-9]*(:[1-9][0-9]*)?$`).MatchString(users[0]) {
		t.Errorf("USER %q: want one numeric non-root user, so runAsNonRoot can be verified", users)
	}

	// `make build` uses the same flags.
	mk, err := os.ReadFile(filepath.Join(root, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^LDFLAGS\s*:?=\s*(.*)$`).FindSubmatch(mk)
	if m == nil {
		t.Fatal("no LDFLAGS in the Makefile")
	}
	if mkLD := strings.ReplaceAll(strings.TrimSpace(string(m[1])), "$(VERSION)", "${VERSION}"); mkLD != ldflags(b.Flags) {
		t.Errorf("ldflags differ:\n  Makefile   %s\n  Dockerfile %s", mkLD, ldflags(b.Flags))
	}
	buildLine := regexp.MustCompile(`(?m)^\t.*go build .*` + regexp.QuoteMeta(mainPackage) + `$`).Find(mk)
	for _, want := range []string{"CGO_ENABLED=0", "-trimpath", "-ldflags '$(LDFLAGS)'"} {
		if !bytes.Contains(buildLine, []byte(want)) {
			t.Errorf("make build line %q lacks %s", buildLine, want)
		}
	}

	// Build with exactly the Dockerfile's environment and flags, for this machine's
	// architecture (BuildKit sets TARGETARCH to the target's).
	if testing.Short() {
		t.Skip("builds the operator")
	}
	args := map[string]string{"VERSION": testVersion, "TARGETOS": "", "TARGETARCH": runtime.GOARCH}
	bin := filepath.Join(t.TempDir(), "webhook-operator")
	buildArgs := []string{"build"}
	for _, f := range b.Flags {
		buildArgs = append(buildArgs, expand(t, f, args))
	}
	buildArgs = append(buildArgs, "-o", bin, b.Pkg)
	cmd := exec.Command("go", buildArgs...)
	cmd.Dir = root
	cmd.Env = os.Environ()
	for _, e := range b.Env {
		cmd.Env = append(cmd.Env, expand(t, e, args))
	}
	t.Logf("%s go %s", strings.Join(cmd.Env[len(cmd.Env)-len(b.Env):], " "), strings.Join(buildArgs, " "))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}

	t.Run("static", func(t *testing.T) {
		f, err := elf.Open(bin)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		for _, p := range f.Progs {
			if p.Type == elf.PT_INTERP {
				t.Error("has a PT_INTERP program header: it needs a dynamic loader, which distroless/static lacks")
			}
			if p.Type == elf.PT_DYNAMIC {
				t.Error("has a PT_DYNAMIC segment")
			}
		}
		if libs, err := f.ImportedLibraries(); err != nil || len(libs) > 0 {
			t.Errorf("DT_NEEDED libraries %q (%v)", libs, err)
		}
		if f.Type != elf.ET_EXEC {
			t.Errorf("ELF type %s, want a static executable (ET_EXEC)", f.Type)
		}
	})

	t.Run("stripped", func(t *testing.T) {
		f, err := elf.Open(bin)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		for _, s := range f.Sections {
			if s.Name == ".symtab" || strings.HasPrefix(s.Name, ".debug_") || strings.HasPrefix(s.Name, ".zdebug_") {
				t.Errorf("section %s present: -s -w did not apply", s.Name)
			}
		}
	})

	t.Run("trimmed", func(t *testing.T) {
		data, err := os.ReadFile(bin)
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(data, []byte(root+"/")) {
			t.Errorf("the binary contains the build directory %s: -trimpath did not apply", root)
		}
	})

	t.Run("build settings", func(t *testing.T) {
		bi, err := buildinfo.ReadFile(bin)
		if err != nil {
			t.Fatal(err)
		}
		settings := map[string]string{}
		for _, s := range bi.Settings {
			settings[s.Key] = s.Value
		}
		// (With -trimpath the go command does not record -ldflags: "version stamped" checks -X.)
		want := map[string]string{"CGO_ENABLED": "0", "-trimpath": "true", "GOOS": "linux", "GOARCH": runtime.GOARCH}
		for k, v := range want {
			if settings[k] != v {
				t.Errorf("build setting %s = %q, want %q", k, settings[k], v)
			}
		}
		if bi.Path != module+"/cmd/webhook-operator" {
			t.Errorf("main package %s", bi.Path)
		}
	})

	t.Run("version stamped", func(t *testing.T) {
		out, err := exec.Command(bin, "version").CombinedOutput()
		if err != nil {
			t.Fatalf("webhook-operator version: %v\n%s", err, out)
		}
		if got := strings.TrimSpace(string(out)); got != testVersion {
			t.Errorf("webhook-operator version printed %q, want %q", got, testVersion)
		}
	})

	// make image packs this binary into the final stage's image; the image must say and hold
	// what the Dockerfile says (docker build would make the same).
	t.Run("packed image", func(t *testing.T) {
		checkPackedImage(t, root, ins, bin)
	})

}

// checkPackedImage packs bin as `make image` does and checks the image against the
// Dockerfile's final stage, read here on its own (not through the packer's reading).
func checkPackedImage(t *testing.T, root string, ins []ociimage.Instruction, bin string) {
	// make image packs make build's binary, from the Dockerfile, with the version.
	dry, err := exec.Command("make", "-C", root, "-n", "image").CombinedOutput()
	if err != nil {
		t.Fatalf("make -n image: %v\n%s", err, dry)
	}
	for _, want := range []string{"-dockerfile Dockerfile", "-build-arg VERSION=", "-source build:/out/webhook-operator=" + filepath.Join(root, "bin") + "/webhook-operator"} {
		if !bytes.Contains(dry, []byte(want)) {
			t.Errorf("make image does not pack with %q:\n%s", want, dry)
		}
	}

	tarFile := filepath.Join(t.TempDir(), "image.tar")
	ref := "ghcr.io/webhook-operator/webhook-operator:" + testVersion
	cmd := exec.Command("go", "run", "./hack/image", "-o", tarFile, "-tag", ref, "-dockerfile", "Dockerfile",
		"-build-arg", "VERSION="+testVersion, "-source", "build:/out/webhook-operator="+bin)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("packing: %v\n%s", err, out)
	}
	img, err := ociimage.Read(tarFile)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}

	// The final stage, as the Dockerfile writes it.
	var last int
	for i, in := range ins {
		if in.Cmd == "FROM" {
			last = i
		}
	}
	labels := map[string]string{}
	var user string
	var entrypoint []string
	for _, in := range ins[last:] {
		switch in.Cmd {
		case "USER":
			user = in.Args
		case "ENTRYPOINT":
			if err := json.Unmarshal([]byte(in.Args), &entrypoint); err != nil {
				t.Fatal(err)
			}
		case "LABEL":
			words, err := ociimage.ShellWords(in.Args)
			if err != nil {
				t.Fatal(err)
			}
			for _, w := range words {
				k, v, _ := strings.Cut(w, "=")
				labels[k] = strings.ReplaceAll(v, "${VERSION}", testVersion)
			}
		}
	}
	if cf.Config.User != user {
		t.Errorf("image user %q, Dockerfile USER %q", cf.Config.User, user)
	}
	if !slices.Equal(cf.Config.Entrypoint, entrypoint) || len(cf.Config.Cmd) != 0 {
		t.Errorf("image entrypoint %q cmd %q, Dockerfile ENTRYPOINT %q", cf.Config.Entrypoint, cf.Config.Cmd, entrypoint)
	}
	if len(labels) == 0 || !maps.Equal(cf.Config.Labels, labels) {
		t.Errorf("image labels %v, Dockerfile LABEL %v", cf.Config.Labels, labels)
	}
	if cf.OS != "linux" || cf.Architecture != runtime.GOARCH {
		t.Errorf("platform %s/%s", cf.OS, cf.Architecture)
	}
	// distroless static nonroot: its working directory and CA bundle variable.
	if cf.Config.WorkingDir != "/home/nonroot" || !slices.Contains(cf.Config.Env, "SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt") {
		t.Errorf("working dir %q env %q: not distroless static's", cf.Config.WorkingDir, cf.Config.Env)
	}

	// What it holds: the binary as built (so with the Dockerfile's build flags), the nonroot
	// user, Debian's CA bundle and time zones, a writable /tmp.
	file := func(p string) ([]byte, *tar.Header) {
		b, h, err := ociimage.ReadFile(img, p)
		if err != nil {
			t.Fatal(err)
		}
		return b, h
	}
	want, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	got, h := file(imageBinary)
	if !bytes.Equal(got, want) || h.Mode&0o111 == 0 || h.Uid != 0 {
		t.Errorf("%s in the image: %d bytes mode %o uid %d; built %d bytes", imageBinary, len(got), h.Mode, h.Uid, len(want))
	}
	uid, gid, _ := strings.Cut(user, ":")
	passwd, _ := file("/etc/passwd")
	if !regexp.MustCompile(`(?m)^nonroot:x:` + uid + `:` + gid + `:`).Match(passwd) {
		t.Errorf("/etc/passwd has no nonroot user %s:\n%s", user, passwd)
	}
	group, _ := file("/etc/group")
	if !regexp.MustCompile(`(?m)^nonroot:x:` + gid + `:`).Match(group) {
		t.Errorf("/etc/group has no nonroot group %s:\n%s", gid, group)
	}
	ca, _ := file("/etc/ssl/certs/ca-certificates.crt")
	hostCA, err := os.ReadFile("/etc/ssl/certs/ca-certificates.crt")
	if err != nil || !bytes.Equal(ca, hostCA) || !bytes.Contains(ca, []byte("BEGIN CERTIFICATE")) {
		t.Errorf("the CA bundle (%d bytes) is not Debian's ca-certificates' (%v)", len(ca), err)
	}
	for _, zone := range []string{"/usr/share/zoneinfo/UTC", "/usr/share/zoneinfo/Europe/Berlin", "/usr/share/zoneinfo/America/Sao_Paulo"} {
		if b, h, err := ociimage.ReadFile(img, zone); err != nil || (len(b) == 0 && h.Typeflag != tar.TypeSymlink) || (h.Typeflag == tar.TypeReg && !bytes.HasPrefix(b, []byte("TZif"))) {
			t.Errorf("time zone %s: %v", zone, err)
		}
	}
	if _, h := file("/tmp"); h.Typeflag != tar.TypeDir || h.Mode&0o1777 != 0o1777 {
		t.Errorf("/tmp mode %o, want 1777", h.Mode)
	}
	if _, h := file("/home/nonroot"); h.Typeflag != tar.TypeDir || fmt.Sprint(h.Uid) != uid {
		t.Errorf("/home/nonroot owned by %d, want %s", h.Uid, uid)
	}
}
