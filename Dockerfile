# syntax=docker/dockerfile:1
# One image, one binary: `webhook-operator controller` and `webhook-operator dispatcher`.
# The build flags match `make build` and are checked by a test (static, trimmed, stamped).
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
RUN CGO_ENABLED=0 GOOS=linux go build -trimpath \
      -ldflags "-s -w -X github.com/webhook-operator/webhook-operator/internal/version.Version=${VERSION}" \
      -o /out/webhook-operator ./cmd/webhook-operator

# distroless/static: CA certificates, tzdata, a nonroot user, nothing else.
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/webhook-operator /webhook-operator
USER 65532:65532
ENTRYPOINT ["/webhook-operator"]
