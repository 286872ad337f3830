// Package config holds what every hapair binary does the same way with its
// configuration: strict YAML loading, errors that name the offending field,
// the common command line (--config, --check-config, --version, one flag per
// field), and the TLS and etcd-client sections shared by several binaries.
//
// Each component package owns its own Config struct, DefaultConfig and
// Validate; this package only reads files and flags into them.
package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"

	"gopkg.in/yaml.v3"
)

// ExitConfig is the exit code of every binary when its configuration is bad.
const ExitConfig = 2

// Validator is implemented by every component Config.
type Validator interface {
	Validate() error
}

// FieldError says which configuration field is wrong, what it held, and why.
// Field is the full dotted path as written in YAML ("etcd.endpoints[1]").
type FieldError struct {
	Field string
	Value any
	Msg   string
}

func (e *FieldError) Error() string {
	if e.Value == nil {
		return fmt.Sprintf("config: %s: %s", e.Field, e.Msg)
	}
	return fmt.Sprintf("config: %s: %s (got %q)", e.Field, e.Msg, fmt.Sprint(e.Value))
}

// Errorf builds a *FieldError for field holding value.
func Errorf(field string, value any, format string, args ...any) error {
	return &FieldError{Field: field, Value: value, Msg: fmt.Sprintf(format, args...)}
}

// Join returns prefix.field, or field when prefix is empty, so nested
// sections can report full paths.
func Join(prefix, field string) string {
	if prefix == "" {
		return field
	}
	return prefix + "." + field
}

// IsConfigError reports whether err came from reading or validating
// configuration (as opposed to a runtime failure), so mains can exit with
// ExitConfig.
func IsConfigError(err error) bool {
	var fe *FieldError
	var le *LoadError
	var ue *UsageError
	return errors.As(err, &fe) || errors.As(err, &le) || errors.As(err, &ue)
}

// LoadError is a file that could not be read or parsed.
type LoadError struct {
	Path string
	Err  error
}

func (e *LoadError) Error() string { return fmt.Sprintf("config: %s: %v", e.Path, e.Err) }
func (e *LoadError) Unwrap() error { return e.Err }

// Load decodes the YAML file at path into dst, which should already hold the
// defaults. Unknown keys are errors: a typo must not silently fall back to a
// default in a system whose defaults decide who is ACTIVE.
func Load(path string, dst any) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return &LoadError{Path: path, Err: err}
	}
	if err := Decode(b, dst); err != nil {
		return &LoadError{Path: path, Err: err}
	}
	return nil
}

// Decode strictly decodes YAML bytes into dst. An empty document leaves dst as is.
func Decode(b []byte, dst any) error {
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(dst); err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	return nil
}
