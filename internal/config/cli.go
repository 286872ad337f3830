package config

import (
	"encoding"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"reflect"
	"strconv"
	"strings"
	"time"
)

// Command is what the common command line asked for.
type Command struct {
	ConfigPath string   // the file that was loaded, or "" when none was
	CheckOnly  bool     // --check-config / -t: validate and exit
	Version    bool     // --version: print the version and exit
	Args       []string // positional arguments left after the flags
}

// UsageError is a command line that could not be parsed.
type UsageError struct{ Err error }

func (e *UsageError) Error() string { return "usage: " + e.Err.Error() }
func (e *UsageError) Unwrap() error { return e.Err }

// ParseCommandLine reads the command line common to every hapair binary:
//
//	--config FILE     the YAML file (default defaultPath; a missing default
//	                  file is not an error, a missing explicit one is)
//	--check-config,-t validate the configuration and exit
//	--version         print the version and exit
//	--<field>         one flag per configuration field, named by its YAML
//	                  path ("--lease-ttl 5s", "--etcd.endpoints a,b")
//
// cfg must be a pointer to a struct already holding the defaults. The order is
// defaults < file < flags; cfg.Validate() runs last. -h returns flag.ErrHelp.
func ParseCommandLine(name string, args []string, defaultPath string, cfg Validator) (Command, error) {
	var cmd Command
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	path := fs.String("config", defaultPath, "configuration file (YAML)")
	fs.BoolVar(&cmd.CheckOnly, "check-config", false, "validate the configuration and exit")
	fs.BoolVar(&cmd.CheckOnly, "t", false, "same as --check-config")
	fs.BoolVar(&cmd.Version, "version", false, "print the version and exit")
	var set []*fieldFlag
	bindFields(fs, reflect.ValueOf(cfg).Elem(), "", &set)
	fs.Usage = func() { printUsage(os.Stderr, name, fs) }
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fs.Usage()
			return cmd, err
		}
		return cmd, &UsageError{Err: err}
	}
	cmd.Args = fs.Args()
	if cmd.Version {
		return cmd, nil
	}
	explicit := false
	fs.Visit(func(f *flag.Flag) { explicit = explicit || f.Name == "config" })
	if *path != "" {
		if _, err := os.Stat(*path); err == nil || explicit {
			if err := Load(*path, cfg); err != nil {
				return cmd, err
			}
			cmd.ConfigPath = *path
		}
	}
	for _, f := range set {
		if err := f.apply(); err != nil {
			return cmd, err
		}
	}
	return cmd, cfg.Validate()
}

func printUsage(w io.Writer, name string, fs *flag.FlagSet) {
	fmt.Fprintf(w, "usage: %s [--config FILE] [--check-config] [--version] [--FIELD VALUE ...]\n", name)
	fs.VisitAll(func(f *flag.Flag) {
		fmt.Fprintf(w, "  --%s\t%s\n", f.Name, f.Usage)
	})
}

// fieldFlag is a flag bound to one configuration field. Parsing only records
// the text (after checking it parses); apply writes it once the file has been
// loaded, so flags override the file whatever their order.
type fieldFlag struct {
	name  string
	field reflect.Value
	text  *string
}

func (f *fieldFlag) String() string {
	if f.text != nil {
		return *f.text
	}
	return ""
}

func (f *fieldFlag) Set(s string) error {
	if _, err := parseScalar(f.field.Type(), s); err != nil {
		return err
	}
	f.text = &s
	return nil
}

func (f *fieldFlag) IsBoolFlag() bool { return f.field.Kind() == reflect.Bool }

func (f *fieldFlag) apply() error {
	if f.text == nil {
		return nil
	}
	v, err := parseScalar(f.field.Type(), *f.text)
	if err != nil {
		return Errorf(f.name, *f.text, "%v", err)
	}
	f.field.Set(v)
	return nil
}

var (
	durationType        = reflect.TypeOf(time.Duration(0))
	textUnmarshalerType = reflect.TypeOf((*encoding.TextUnmarshaler)(nil)).Elem()
)

// bindFields registers a flag for every scalar field of the struct v, recursing
// into nested structs (not into slices or maps of structs, which have no
// sensible flag form).
func bindFields(fs *flag.FlagSet, v reflect.Value, prefix string, set *[]*fieldFlag) {
	t := v.Type()
	for i := 0; i < t.NumField(); i++ {
		sf := t.Field(i)
		if !sf.IsExported() {
			continue
		}
		name := strings.Split(sf.Tag.Get("yaml"), ",")[0]
		if name == "-" || name == "" {
			continue
		}
		path := Join(prefix, name)
		fv := v.Field(i)
		if fv.Kind() == reflect.Struct && fv.Type() != durationType {
			bindFields(fs, fv, path, set)
			continue
		}
		if _, err := parseScalar(fv.Type(), ""); errors.Is(err, errUnsupported) {
			continue
		}
		if fs.Lookup(path) != nil {
			continue // a common flag ("config", "version") wins
		}
		ff := &fieldFlag{name: path, field: fv}
		*set = append(*set, ff)
		fs.Var(ff, path, "overrides "+path+" of the file")
	}
}

var errUnsupported = errors.New("unsupported flag type")

// parseScalar converts s to a value of type t. An empty s is only used to
// probe support, so conversion errors on it are not reported as unsupported.
func parseScalar(t reflect.Type, s string) (reflect.Value, error) {
	if reflect.PointerTo(t).Implements(textUnmarshalerType) {
		// A type that reads its own text ("64MB") reads flags the same way.
		v := reflect.New(t)
		err := v.Interface().(encoding.TextUnmarshaler).UnmarshalText([]byte(s))
		return v.Elem(), err
	}
	if t == durationType {
		d, err := time.ParseDuration(s)
		return reflect.ValueOf(d), err
	}
	switch t.Kind() {
	case reflect.String:
		return reflect.ValueOf(s).Convert(t), nil
	case reflect.Bool:
		b, err := strconv.ParseBool(s)
		return reflect.ValueOf(b).Convert(t), err
	case reflect.Int, reflect.Int32, reflect.Int64:
		n, err := strconv.ParseInt(s, 0, t.Bits())
		return reflect.ValueOf(n).Convert(t), err
	case reflect.Uint, reflect.Uint32, reflect.Uint64:
		n, err := strconv.ParseUint(s, 0, t.Bits())
		return reflect.ValueOf(n).Convert(t), err
	case reflect.Float64:
		f, err := strconv.ParseFloat(s, 64)
		return reflect.ValueOf(f), err
	case reflect.Slice:
		if t.Elem().Kind() != reflect.String {
			return reflect.Value{}, errUnsupported
		}
		out := reflect.MakeSlice(t, 0, 4)
		for _, p := range strings.Split(s, ",") {
			if p = strings.TrimSpace(p); p != "" {
				out = reflect.Append(out, reflect.ValueOf(p).Convert(t.Elem()))
			}
		}
		return out, nil
	}
	return reflect.Value{}, errUnsupported
}
