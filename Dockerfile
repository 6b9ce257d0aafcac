# syntax=docker/dockerfile:1
# Builds the proxy, and the replica host (cmd/replica), as static binaries
# and ships them on distroless, running as the nonroot user (uid 65532).
# The entrypoint is the proxy; a replica host runs /replica instead.
# Build: docker build --build-arg VERSION=v1.2.3 .

FROM golang:1.26 AS build
WORKDIR /src
# Module download first so source edits reuse the cached layer.
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X github.com/serveproxy/serveproxy/cmd/proxy/proxycmd.Version=${VERSION} -X github.com/serveproxy/serveproxy/cmd/replica/replicacmd.Version=${VERSION}" \
	-o /out/ ./cmd/proxy ./cmd/replica

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/proxy /out/replica /
# Inside a container the loopback defaults would be unreachable from outside.
ENV PROXY_HTTP_ADDR=0.0.0.0:8000 PROXY_ADMIN_ADDR=0.0.0.0:8080
EXPOSE 8000 8080
USER nonroot
ENTRYPOINT ["/proxy"]
