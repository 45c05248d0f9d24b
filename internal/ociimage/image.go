package ociimage

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// Epoch is the time of every file and of the image: images packed from the same inputs are
// identical.
var Epoch = time.Unix(0, 0).UTC()

// File is one entry of a layer.
type File struct {
	// Path in the image, absolute.
	Path string
	// Mode: permission bits, plus fs.ModeDir for a directory or fs.ModeSymlink for a link.
	Mode     fs.FileMode
	UID, GID int
	// Data is a regular file's contents, unless Source names a file of this machine to read.
	Data   []byte
	Source string
	// Link is a symbolic link's target.
	Link string
}

// Layer is a named set of files (the name only explains the layer in errors).
type Layer struct {
	Name  string
	Files []File
}

// Spec is everything one image holds: its layers, bottom first, and its configuration.
type Spec struct {
	Layers []Layer
	Config v1.Config
}

// The distroless image the Dockerfile's final stage starts from, and the one the packer
// reproduces from this machine's Debian packages (ca-certificates, tzdata).
const (
	DistrolessStatic        = "gcr.io/distroless/static-debian12"
	DistrolessStaticNonroot = DistrolessStatic + ":nonroot"
	// NonrootUID is distroless' nonroot user (and group).
	NonrootUID = 65532
)

// Where the base's files come from on this machine.
var (
	CABundle    = "/etc/ssl/certs/ca-certificates.crt"
	ZoneinfoDir = "/usr/share/zoneinfo"
)

// Passwd and Group are distroless static's /etc/passwd and /etc/group.
const (
	Passwd = "root:x:0:0:root:/root:/sbin/nologin\n" +
		"nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\n" +
		"nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n"
	Group = "root:x:0:\nnobody:x:65534:\ntty:x:5:\nstaff:x:50:\nnonroot:x:65532:\n"
)

// StaticNonroot is distroless static nonroot's contents and configuration, built from this
// machine's files: /etc/passwd and /etc/group with the nonroot user (65532), the CA bundle of
// Debian's ca-certificates, the time zones of Debian's tzdata, /etc/nsswitch.conf, /tmp
// (1777) and the nonroot user's home, which is the working directory; the user is nonroot and
// SSL_CERT_FILE names the bundle, as in distroless.
func StaticNonroot() (Spec, error) {
	files := []File{
		{Path: "/etc", Mode: fs.ModeDir | 0o755},
		{Path: "/etc/passwd", Mode: 0o644, Data: []byte(Passwd)},
		{Path: "/etc/group", Mode: 0o644, Data: []byte(Group)},
		{Path: "/etc/nsswitch.conf", Mode: 0o644, Data: []byte("hosts: files dns\n")},
		{Path: "/etc/ssl", Mode: fs.ModeDir | 0o755},
		{Path: "/etc/ssl/certs", Mode: fs.ModeDir | 0o755},
		{Path: "/etc/ssl/certs/ca-certificates.crt", Mode: 0o644, Source: CABundle},
		{Path: "/home", Mode: fs.ModeDir | 0o755},
		{Path: "/home/nonroot", Mode: fs.ModeDir | 0o700, UID: NonrootUID, GID: NonrootUID},
		{Path: "/root", Mode: fs.ModeDir | 0o700},
		{Path: "/tmp", Mode: fs.ModeDir | fs.ModeSticky | 0o777},
		{Path: "/usr", Mode: fs.ModeDir | 0o755},
		{Path: "/usr/share", Mode: fs.ModeDir | 0o755},
	}
	if _, err := os.Stat(CABundle); err != nil {
		return Spec{}, fmt.Errorf("the CA bundle (Debian's ca-certificates): %w", err)
	}
	zones, err := TreeFiles(ZoneinfoDir, ZoneinfoDir)
	if err != nil {
		return Spec{}, fmt.Errorf("the time zones (Debian's tzdata): %w", err)
	}
	if len(zones) < 100 {
		return Spec{}, fmt.Errorf("the time zones (Debian's tzdata): only %d files in %s", len(zones), ZoneinfoDir)
	}
	files = append(files, zones...)
	return Spec{
		Layers: []Layer{{Name: DistrolessStaticNonroot, Files: files}},
		Config: v1.Config{
			User:       fmt.Sprint(NonrootUID),
			WorkingDir: "/home/nonroot",
			Env: []string{
				"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
				"SSL_CERT_FILE=" + "/etc/ssl/certs/ca-certificates.crt",
			},
		},
	}, nil
}

// TreeFiles lists the directory tree at dir of this machine as image files under the same
// absolute path, keeping symbolic links as links.
func TreeFiles(dir, imagePath string) ([]File, error) {
	var out []File
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		f := File{Path: path.Join(imagePath, filepath.ToSlash(rel))}
		info, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case d.IsDir():
			f.Mode = fs.ModeDir | 0o755
		case d.Type()&fs.ModeSymlink != 0:
			if f.Link, err = os.Readlink(p); err != nil {
				return err
			}
			f.Mode = fs.ModeSymlink | 0o777
		case d.Type().IsRegular():
			f.Mode, f.Source = info.Mode().Perm(), p
		default:
			return fmt.Errorf("%s: neither a file, a directory nor a link", p)
		}
		out = append(out, f)
		return nil
	})
	return out, err
}

// FromStage is the image a Dockerfile's final stage builds, where sources maps each COPY's
// "<from>:<src>" (from empty for the build context) to the file of this machine that holds
// what the build made there. Only distroless static nonroot (or scratch) can be the base.
func FromStage(st *Stage, sources map[string]string) (Spec, error) {
	var spec Spec
	switch {
	case st.From == "scratch":
	case st.From == DistrolessStaticNonroot:
		var err error
		if spec, err = StaticNonroot(); err != nil {
			return Spec{}, err
		}
	default:
		return Spec{}, fmt.Errorf("FROM %s: only %s or scratch can be packed here", st.From, DistrolessStaticNonroot)
	}
	for _, c := range st.Copies {
		key := c.From + ":" + c.Src
		src, ok := sources[key]
		if !ok {
			return Spec{}, fmt.Errorf("COPY %s %s: no file given for %q", c.Src, c.Dst, key)
		}
		info, err := os.Stat(src)
		if err != nil {
			return Spec{}, fmt.Errorf("COPY %s %s: %w", c.Src, c.Dst, err)
		}
		if !info.Mode().IsRegular() {
			return Spec{}, fmt.Errorf("COPY %s %s: %s is not a regular file", c.Src, c.Dst, src)
		}
		// COPY keeps the file's mode and makes it root's.
		spec.Layers = append(spec.Layers, Layer{Name: "COPY " + key, Files: []File{{Path: c.Dst, Mode: info.Mode().Perm(), Source: src}}})
	}
	if st.User != "" {
		spec.Config.User = st.User
	}
	if st.WorkingDir != "" {
		spec.Config.WorkingDir = st.WorkingDir
	}
	spec.Config.Env = append(spec.Config.Env, st.Env...)
	spec.Config.Entrypoint = st.Entrypoint
	spec.Config.Cmd = st.Cmd
	if len(st.Labels) > 0 {
		spec.Config.Labels = st.Labels
	}
	return spec, nil
}

// Image builds the image: one layer per Layer, the configuration, linux and this machine's
// architecture.
func (s Spec) Image() (v1.Image, error) {
	img := empty.Image
	for _, l := range s.Layers {
		data, err := layerTar(l.Files)
		if err != nil {
			return nil, fmt.Errorf("layer %s: %w", l.Name, err)
		}
		layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil })
		if err != nil {
			return nil, fmt.Errorf("layer %s: %w", l.Name, err)
		}
		if img, err = mutate.AppendLayers(img, layer); err != nil {
			return nil, err
		}
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", runtime.GOARCH
	cf.Created = v1.Time{Time: Epoch}
	cf.Config = s.Config
	return mutate.ConfigFile(img, cf)
}

// layerTar writes the files as an uncompressed tar, with every missing parent directory
// (0755, root's) added before its children.
func layerTar(files []File) ([]byte, error) {
	have := map[string]bool{}
	for _, f := range files {
		have[path.Clean(f.Path)] = true
	}
	var all []File
	for _, f := range files {
		for d := path.Dir(path.Clean(f.Path)); d != "/" && !have[d]; d = path.Dir(d) {
			have[d] = true
			all = append(all, File{Path: d, Mode: fs.ModeDir | 0o755})
		}
		all = append(all, f)
	}
	// Parents before children; stable, so the listed order otherwise stays.
	slices.SortStableFunc(all, func(a, b File) int { return strings.Compare(path.Clean(a.Path), path.Clean(b.Path)) })
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range all {
		p := strings.TrimPrefix(path.Clean(f.Path), "/")
		if p == "" || !path.IsAbs(f.Path) {
			return nil, fmt.Errorf("%q: want an absolute path below /", f.Path)
		}
		h := &tar.Header{Name: p, Mode: int64(f.Mode.Perm()), Uid: f.UID, Gid: f.GID, ModTime: Epoch, Format: tar.FormatPAX}
		if f.Mode&fs.ModeSticky != 0 {
			h.Mode |= 0o1000
		}
		var data []byte
		switch {
		case f.Mode.IsDir():
			h.Typeflag, h.Name = tar.TypeDir, p+"/"
		case f.Mode&fs.ModeSymlink != 0:
			h.Typeflag, h.Linkname = tar.TypeSymlink, f.Link
		default:
			h.Typeflag, data = tar.TypeReg, f.Data
			if f.Source != "" {
				var err error
				if data, err = os.ReadFile(f.Source); err != nil {
					return nil, err
				}
			}
			h.Size = int64(len(data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if _, err := tw.Write(data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// Write writes the image as a tarball (the `docker save` layout, which `ctr images import`
// and `docker load` read) tagged ref, e.g. ghcr.io/webhook-operator/webhook-operator:v0.1.0.
func Write(file, ref string, img v1.Image) error {
	tag, err := name.NewTag(ref)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
		return err
	}
	tmp := file + ".tmp"
	if err := tarball.WriteToFile(tmp, tag, img); err != nil {
		os.Remove(tmp)
		return err
	}
	return os.Rename(tmp, file)
}

// Read reads an image tarball Write wrote.
func Read(file string) (v1.Image, error) { return tarball.ImageFromPath(file, nil) }

// ReadFile returns the contents of the file at p (absolute) in the image, the last layer
// holding it winning.
func ReadFile(img v1.Image, p string) ([]byte, *tar.Header, error) {
	want := strings.TrimPrefix(path.Clean(p), "/")
	layers, err := img.Layers()
	if err != nil {
		return nil, nil, err
	}
	for i := len(layers) - 1; i >= 0; i-- {
		rc, err := layers[i].Uncompressed()
		if err != nil {
			return nil, nil, err
		}
		tr := tar.NewReader(rc)
		for {
			h, err := tr.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				rc.Close()
				return nil, nil, err
			}
			if strings.TrimSuffix(h.Name, "/") == want {
				b, err := io.ReadAll(tr)
				rc.Close()
				return b, h, err
			}
		}
		rc.Close()
	}
	return nil, nil, fmt.Errorf("%s: not in the image", p)
}
