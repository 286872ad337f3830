# hapair — build, test, run. `make help` lists the targets.
GO       ?= go
BIN      ?= bin
VERSION  ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
LDFLAGS  := -s -w -X github.com/hapair/hapair/internal/daemon.Version=$(VERSION)
BINARIES := $(notdir $(wildcard cmd/*))
export PATH := $(PATH):/usr/local/go/bin
SHELL    := /bin/bash

.PHONY: help deps build test test-deploy vet demo bench clean

help:
	@echo "make demo   the main job: a complete local cluster and a switchover with timings"
	@echo "make test   install test dependencies, then vet and run every test with -race"
	@echo "make build  build $(BINARIES) into $(BIN)/"
	@echo "make bench  every side-by-side benchmark, one table, bench/RESULTS.md (BENCH_QUICK=1: a few minutes)"

deps:
	scripts/deps.sh test lab

build:
	@mkdir -p $(BIN)
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/ ./cmd/...

vet:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt needed"; exit 1; }
	$(GO) vet ./...

# Every package with -race; the lab's unit parts too (-short skips its long
# end-to-end scenarios there). Then the lab scenarios alone, so their timings
# are not stretched by other test binaries running beside them.
LAB_PKGS := ./lab/...
test: deps vet
	$(GO) test -race -count=1 -timeout 20m $$($(GO) list ./... | grep -v -e '/lab' -e '/deploy/hosts')
	$(GO) test -race -count=1 -short $(LAB_PKGS)
	# hapair-lb's socket calls differ under -race (sockio_race.go): test the production ones too.
	$(GO) test -count=1 ./lb/
	@mkdir -p $(BIN)
	$(GO) test -count=1 -timeout 32m -run TestLab -v ./lab/ > $(BIN)/lab-test.log 2>&1 || { tail -n 300 $(BIN)/lab-test.log; scripts/failures.sh $(BIN)/lab-test.log lab; exit 1; }
	@head -c 300000 $(BIN)/lab-test.log
	# deploy/hosts' unit tests, then the deployment itself on five systemd hosts.
	$(GO) test -race -count=1 -short ./deploy/hosts/
	$(MAKE) --no-print-directory test-deploy

# The deployment on five systemd hosts (deploy/hosts, as root; README, Deploy):
# site.yml, drill, rolling upgrade, restarts, reboots. Also the end of `make test`.
test-deploy:
	scripts/deps.sh test deploy
	@mkdir -p $(BIN)
	HAPAIR_DEPLOY_LOG_DIR=$(CURDIR)/$(BIN)/deploy-logs $(GO) test -race -count=1 -timeout 75m -run TestDeploySystemd -v ./deploy/hosts/ > $(BIN)/deploy-test.log 2>&1 || { tail -n 300 $(BIN)/deploy-test.log; scripts/failures.sh $(BIN)/deploy-test.log deploy/hosts; exit 1; }
	@grep -E 'FIGURE|^(---|===|ok|FAIL|PASS)' $(BIN)/deploy-test.log

demo: build
	scripts/deps.sh lab
	CGO_ENABLED=0 $(GO) build -trimpath -o $(BIN)/hapair-lab ./lab/cmd/hapair-lab
	$(BIN)/hapair-lab demo

# Every side-by-side benchmark, serialised, as root (bench/all.sh says why).
bench:
	bench/all.sh

clean:
	rm -rf $(BIN)
