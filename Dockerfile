# syntax=docker/dockerfile:1
# One image, one binary: `webhook-operator controller` and `webhook-operator dispatcher`.
# The controller starts dispatchers from this same image, so the two never drift apart.
#
#   docker build --build-arg VERSION=$(git describe --tags --always --dirty) -t webhook-operator .
#   docker buildx build --platform linux/amd64,linux/arm64 --build-arg VERSION=v0.1.0 -t ... .
#
# The build line matches `make build` and is parsed by test/image, which builds with exactly
# these flags and checks that the binary is static, trimmed and version stamped.

# Build on the builder's platform and cross-compile: no emulation for other architectures.
FROM --platform=$BUILDPLATFORM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
# Set by BuildKit from --platform; without one, the builder's own architecture and linux.
ARG TARGETOS
ARG TARGETARCH
ARG VERSION=dev
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=${TARGETOS:-linux} GOARCH=${TARGETARCH} go build -trimpath \
      -ldflags "-s -w -X github.com/webhook-operator/webhook-operator/internal/version.Version=${VERSION}" \
      -o /out/webhook-operator ./cmd/webhook-operator

# distroless/static: CA certificates, tzdata, a nonroot user, nothing else (no shell).
FROM gcr.io/distroless/static-debian12:nonroot
ARG VERSION=dev
LABEL org.opencontainers.image.title="webhook-operator" \
      org.opencontainers.image.description="Deliver NATS JetStream events to webhook endpoints declared as Kubernetes resources" \
      org.opencontainers.image.source="https://github.com/webhook-operator/webhook-operator" \
      org.opencontainers.image.version="${VERSION}"
COPY --from=build /out/webhook-operator /webhook-operator
# Numeric, so the kubelet can verify runAsNonRoot.
USER 65532:65532
ENTRYPOINT ["/webhook-operator"]
