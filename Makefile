# hapair — build, test, run. `make help` lists the targets.
GO       ?= go
BIN      ?= bin
VERSION  ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
LDFLAGS  := -s -w -X github.com/hapair/hapair/internal/daemon.Version=$(VERSION)
BINARIES := $(notdir $(wildcard cmd/*))
export PATH := $(PATH):/usr/local/go/bin

.PHONY: help deps build test vet demo clean

help:
	@echo "make demo   the main job: a complete local cluster and a switchover with timings"
	@echo "make test   install test dependencies, then vet and run every test with -race"
	@echo "make build  build $(BINARIES) into $(BIN)/"

deps:
	scripts/deps.sh test

build:
	@mkdir -p $(BIN)
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/ ./cmd/...

vet:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt needed"; exit 1; }
	$(GO) vet ./...

test: deps vet
	$(GO) test -race -count=1 -timeout 25m ./...

demo: build
	scripts/demo.sh

clean:
	rm -rf $(BIN)
