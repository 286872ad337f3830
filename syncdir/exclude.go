package syncdir

import (
	"path"
	"strings"
)

// excluder decides which relative paths never travel.
type excluder struct {
	names    []string // "*.tmp": base name at any depth
	dirNames []string // "cache/": directory base name at any depth
	paths    []string // "a/*.log": whole relative path
	dirPaths []string // "a/cache/": whole relative path of a directory
}

func newExcluder(globs []string) excluder {
	var x excluder
	for _, g := range globs {
		dir := strings.HasSuffix(g, "/")
		g = strings.TrimPrefix(strings.TrimSuffix(g, "/"), "/")
		full := strings.Contains(g, "/")
		switch {
		case dir && full:
			x.dirPaths = append(x.dirPaths, g)
		case dir:
			x.dirNames = append(x.dirNames, g)
		case full:
			x.paths = append(x.paths, g)
		default:
			x.names = append(x.names, g)
		}
	}
	return x
}

// reserved names are ours: the quarantine and in-flight temp files.
func reserved(rel string) bool {
	first, _, _ := strings.Cut(rel, "/")
	return first == quarantineDir || strings.HasPrefix(path.Base(rel), tempPrefix)
}

// match reports whether rel (clean, relative) is excluded. Only the entry
// itself is tested; walkers skip excluded directories, so their contents
// never reach here, and event paths are tested with matchAny.
func (x excluder) match(rel string, isDir bool) bool {
	if reserved(rel) {
		return true
	}
	base := path.Base(rel)
	for _, g := range x.names {
		if ok, _ := path.Match(g, base); ok {
			return true
		}
	}
	for _, g := range x.paths {
		if ok, _ := path.Match(g, rel); ok {
			return true
		}
	}
	if !isDir {
		return false
	}
	for _, g := range x.dirNames {
		if ok, _ := path.Match(g, base); ok {
			return true
		}
	}
	for _, g := range x.dirPaths {
		if ok, _ := path.Match(g, rel); ok {
			return true
		}
	}
	return false
}

// matchAny reports whether rel or any of its parent directories is excluded.
func (x excluder) matchAny(rel string, isDir bool) bool {
	if x.match(rel, isDir) {
		return true
	}
	for d := path.Dir(rel); d != "."; d = path.Dir(d) {
		if x.match(d, true) {
			return true
		}
	}
	return false
}
