// Command image packs a container image tarball with internal/ociimage, either the
// Dockerfile's final stage (make image) or a static binary on distroless static nonroot (the
// real cluster's images: nats-server, CoreDNS, the pause container, test receivers):
//
//	go run ./hack/image -o bin/images/webhook-operator.tar -tag <ref> \
//	    -dockerfile Dockerfile -build-arg VERSION=v0.1.0 -source build:/out/webhook-operator=bin/webhook-operator
//	go run ./hack/image -o bin/images/nats-server.tar -tag <ref> \
//	    -file /nats-server=bin/nats-server -entrypoint /nats-server -label org.opencontainers.image.version=v2.15.2
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/webhook-operator/webhook-operator/internal/ociimage"
)

// multi is a repeatable flag of key=value pairs.
type multi []string

func (m *multi) String() string     { return strings.Join(*m, ",") }
func (m *multi) Set(v string) error { *m = append(*m, v); return nil }

func pairs(m multi, flagName string) (map[string]string, error) {
	out := map[string]string{}
	for _, kv := range m {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("-%s %q: want key=value", flagName, kv)
		}
		out[k] = v
	}
	return out, nil
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
}

func run() error {
	var (
		out, tag, dockerfile, entrypoint, user, base string
		buildArgs, sources, files, labels            multi
	)
	flag.StringVar(&out, "o", "", "the image tarball to write")
	flag.StringVar(&tag, "tag", "", "the image's reference, e.g. ghcr.io/webhook-operator/webhook-operator:v0.1.0")
	flag.StringVar(&dockerfile, "dockerfile", "", "pack this Dockerfile's final stage")
	flag.Var(&buildArgs, "build-arg", "NAME=value of an ARG (with -dockerfile; repeatable)")
	flag.Var(&sources, "source", "<stage>:<path>=<file>: the file of this machine holding what the final stage COPYs from <stage>:<path> (with -dockerfile; repeatable)")
	flag.StringVar(&base, "base", ociimage.DistrolessStaticNonroot, "without -dockerfile: the base, "+ociimage.DistrolessStaticNonroot+" or scratch")
	flag.Var(&files, "file", "<path in the image>=<file>: add a file (without -dockerfile; repeatable)")
	flag.StringVar(&entrypoint, "entrypoint", "", "without -dockerfile: the entrypoint, space-separated words")
	flag.StringVar(&user, "user", fmt.Sprintf("%d:%d", ociimage.NonrootUID, ociimage.NonrootUID), "without -dockerfile: the user")
	flag.Var(&labels, "label", "key=value (without -dockerfile; repeatable)")
	flag.Parse()
	if out == "" || tag == "" || flag.NArg() > 0 {
		flag.Usage()
		return fmt.Errorf("-o and -tag are required, and nothing else")
	}
	var st *ociimage.Stage
	if dockerfile != "" {
		b, err := os.ReadFile(dockerfile)
		if err != nil {
			return err
		}
		ins, err := ociimage.ParseDockerfile(b)
		if err != nil {
			return err
		}
		args, err := pairs(buildArgs, "build-arg")
		if err != nil {
			return err
		}
		if st, err = ociimage.FinalStage(ins, args); err != nil {
			return fmt.Errorf("%s: %w", dockerfile, err)
		}
	} else {
		l, err := pairs(labels, "label")
		if err != nil {
			return err
		}
		st = &ociimage.Stage{From: base, User: user, Entrypoint: strings.Fields(entrypoint), Labels: l}
		f, err := pairs(files, "file")
		if err != nil {
			return err
		}
		sources = nil
		for dst, src := range f {
			st.Copies = append(st.Copies, ociimage.Copy{Src: dst, Dst: dst})
			sources = append(sources, ":"+dst+"="+src)
		}
	}
	src, err := pairs(sources, "source")
	if err != nil {
		return err
	}
	spec, err := ociimage.FromStage(st, src)
	if err != nil {
		return err
	}
	img, err := spec.Image()
	if err != nil {
		return err
	}
	if err := ociimage.Write(out, tag, img); err != nil {
		return err
	}
	d, _ := img.Digest()
	fmt.Printf("%s %s (%s)\n", out, tag, d)
	return nil
}
