// Package ociimage packs static binaries into container images without a builder or a
// registry: the image of the Dockerfile's final stage (FROM distroless static nonroot, LABEL,
// USER, ENTRYPOINT, COPY of what the build stage made) reproduced from this machine's Debian
// packages and a binary built with the Dockerfile's flags, and the small images of the real
// cluster (nats-server, CoreDNS, the pause container, test receivers and producers). Images are
// written as tarballs that `ctr images import` (and `docker load`) read, with go-containerregistry.
//
// The Dockerfile stays the truth: FinalStage refuses an instruction it cannot reproduce, and
// test/image checks the packed image against the Dockerfile (user, entrypoint, labels, the
// binary's build flags).
package ociimage
