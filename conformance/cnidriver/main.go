// Command cnidriver runs CNI network configurations through libcni, the
// library containerd and CRI-O embed, so that the conformance tests exercise
// linkerd-cni exactly as a container runtime would: config lookup by network
// name, chaining with prevResult, result version conversion, the result
// cache, and error decoding.
//
// Its interface follows the reference cnitool:
//
//	cnidriver [-error-json] add|check|del <network-name> <netns-path>
//	cnidriver [-error-json] validate <network-name>
//	cnidriver [-error-json] version <plugin-type>
//
// Environment: NETCONFPATH (conf dir), CNI_PATH (plugin dirs), CNI_ARGS
// (K=V;K=V), CNI_IFNAME (default eth0), CNI_CONTAINERID (default derived
// from the netns path, like cnitool), CAP_ARGS (capability args as a JSON
// object), CNI_CACHE_DIR (libcni's result cache). Unlike cnitool, the conf
// dir and the cache dir have no default: a test must never read the
// machine's /etc/cni/net.d or write /var/lib/cni.
//
// CNIDRIVER_TRACE names a file that receives, as a JSON array, every plugin
// execution libcni made (command, CNI_* environment, stdin, stdout, stderr,
// error), also when the command fails: the tests compare what libcni handed
// a plugin as prevResult with what the plugin printed.
//
// The result JSON goes to stdout. On failure the error goes to stderr and
// the exit code is 1 (2 for a malformed command line); with -error-json
// stdout also carries {"error": "...", "code": N, "msg": "...",
// "details": "..."}, the last three only when libcni decoded a CNI error
// object from a plugin.
//
// Built in GOPATH mode against Debian's golang-github-appc-cni-dev (no
// network, no go.mod): the test harness runs the build.
package main

import (
	"bytes"
	"context"
	"crypto/sha512"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/version"
)

// Bounds one whole libcni operation: a hung plugin fails the test instead of
// hanging it.
const opTimeout = 2 * time.Minute

func usage() {
	fmt.Fprint(os.Stderr, `usage:
  cnidriver [-error-json] add|check|del <network-name> <netns-path>
  cnidriver [-error-json] validate <network-name>
  cnidriver [-error-json] version <plugin-type>
`)
}

func main() {
	errorJSON := flag.Bool("error-json", false, "on failure, also print the error as JSON on stdout")
	flag.Usage = usage
	flag.Parse()
	args := flag.Args()

	tracer := &tracingExec{raw: &invoke.RawExec{}}
	out, err := run(args, tracer)
	if terr := tracer.write(os.Getenv("CNIDRIVER_TRACE")); terr != nil && err == nil {
		err = terr
	}
	if errors.Is(err, errUsage) {
		usage()
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "cnidriver: %v\n", err)
		if *errorJSON {
			printErrorJSON(err)
		}
		os.Exit(1)
	}
	if out != nil {
		os.Stdout.Write(append(out, '\n'))
	}
}

// errUsage reports a malformed command line; main prints the usage text.
var errUsage = errors.New("bad command line")

// argCount is how many arguments (command included) each command takes.
var argCount = map[string]int{"add": 3, "check": 3, "del": 3, "validate": 2, "version": 2}

func run(args []string, exec *tracingExec) ([]byte, error) {
	if len(args) == 0 || argCount[args[0]] != len(args) {
		return nil, errUsage
	}
	cmd, name := args[0], args[1]

	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()

	paths := filepath.SplitList(os.Getenv("CNI_PATH"))
	if len(paths) == 0 {
		return nil, errors.New("CNI_PATH is not set")
	}

	if cmd == "version" {
		cni := libcni.NewCNIConfigWithCacheDir(paths, "", exec)
		info, err := cni.GetVersionInfo(ctx, name)
		if err != nil {
			return nil, err
		}
		return json.Marshal(map[string]interface{}{
			"supportedVersions": info.SupportedVersions(),
			// What libcni asked for: the spec version it implements.
			"requested": version.Current(),
			// The spec versions whose results this libcni can parse.
			"libcniVersions": version.All.SupportedVersions(),
		})
	}

	confDir := os.Getenv("NETCONFPATH")
	if confDir == "" {
		return nil, errors.New("NETCONFPATH is not set (no default, to keep tests off /etc/cni/net.d)")
	}
	cacheDir := os.Getenv("CNI_CACHE_DIR")
	if cacheDir == "" {
		return nil, errors.New("CNI_CACHE_DIR is not set (no default, to keep tests off /var/lib/cni)")
	}
	cni := libcni.NewCNIConfigWithCacheDir(paths, cacheDir, exec)

	// libcni's lookup by name, as cnitool does it: *.conflist files in byte
	// order first, then a *.conf or *.json upgraded to a one-plugin list.
	list, err := libcni.LoadConfList(confDir, name)
	if err != nil {
		return nil, err
	}

	if cmd == "validate" {
		caps, err := cni.ValidateNetworkList(ctx, list)
		if err != nil {
			return nil, err
		}
		if caps == nil {
			caps = []string{}
		}
		return json.Marshal(map[string]interface{}{"capabilities": caps})
	}

	rt, err := runtimeConf(args[2])
	if err != nil {
		return nil, err
	}
	switch cmd {
	case "add":
		res, err := cni.AddNetworkList(ctx, list, rt)
		if err != nil {
			return nil, err
		}
		out, err := json.Marshal(res)
		if err != nil {
			return nil, fmt.Errorf("encoding the result: %w", err)
		}
		return out, nil
	case "check":
		return nil, cni.CheckNetworkList(ctx, list, rt)
	default: // "del"
		return nil, cni.DelNetworkList(ctx, list, rt)
	}
}

func runtimeConf(netns string) (*libcni.RuntimeConf, error) {
	id := os.Getenv("CNI_CONTAINERID")
	if id == "" {
		sum := sha512.Sum512([]byte(netns))
		id = fmt.Sprintf("cnitool-%x", sum[:])[:25]
	}
	ifname := os.Getenv("CNI_IFNAME")
	if ifname == "" {
		ifname = "eth0"
	}
	rt := &libcni.RuntimeConf{ContainerID: id, NetNS: netns, IfName: ifname}

	if s := os.Getenv("CNI_ARGS"); s != "" {
		for _, kv := range strings.Split(s, ";") {
			k, v, ok := strings.Cut(kv, "=")
			if !ok {
				return nil, fmt.Errorf("CNI_ARGS: %q is not K=V", kv)
			}
			rt.Args = append(rt.Args, [2]string{k, v})
		}
	}
	if s := os.Getenv("CAP_ARGS"); s != "" {
		if err := json.Unmarshal([]byte(s), &rt.CapabilityArgs); err != nil {
			return nil, fmt.Errorf("CAP_ARGS is not a JSON object: %w", err)
		}
	}
	return rt, nil
}

func printErrorJSON(err error) {
	out := map[string]interface{}{"error": err.Error()}
	// libcni wraps a plugin's error ("plugin type=... failed (add): %w");
	// the object inside is what a runtime would log and report.
	var cniErr *types.Error
	if errors.As(err, &cniErr) {
		out["code"] = cniErr.Code
		out["msg"] = cniErr.Msg
		out["details"] = cniErr.Details
	}
	b, merr := json.Marshal(out)
	if merr != nil {
		return
	}
	os.Stdout.Write(append(b, '\n'))
}

// execRecord is one plugin execution as libcni made it. Stdout of a failed
// execution is not available: libcni's RawExec decodes it into the error it
// returns and keeps the bytes; Env lets a test replay the execution.
type execRecord struct {
	Plugin     string            `json:"plugin"`
	Command    string            `json:"command"`
	Env        map[string]string `json:"env"`
	Stdin      string            `json:"stdin"`
	Stdout     string            `json:"stdout"`
	Stderr     string            `json:"stderr"`
	Error      string            `json:"error,omitempty"`
	DurationUS int64             `json:"durationUs"`
}

// tracingExec is libcni's default exec (RawExec plus the version decoder)
// with every execution recorded. Plugin stderr is kept per execution rather
// than interleaved on our stderr.
type tracingExec struct {
	raw     *invoke.RawExec
	decoder version.PluginDecoder
	mu      sync.Mutex
	records []execRecord
}

var _ invoke.Exec = &tracingExec{}

func (t *tracingExec) ExecPlugin(ctx context.Context, pluginPath string, stdin []byte, environ []string) ([]byte, error) {
	var stderr bytes.Buffer
	raw := &invoke.RawExec{Stderr: &stderr}
	start := time.Now()
	out, err := raw.ExecPlugin(ctx, pluginPath, stdin, environ)
	rec := execRecord{
		Plugin:     filepath.Base(pluginPath),
		Command:    envValue(environ, "CNI_COMMAND"),
		Env:        cniEnv(environ),
		Stdin:      string(stdin),
		Stdout:     string(out),
		Stderr:     stderr.String(),
		DurationUS: time.Since(start).Microseconds(),
	}
	if err != nil {
		rec.Error = err.Error()
	}
	t.mu.Lock()
	t.records = append(t.records, rec)
	t.mu.Unlock()
	return out, err
}

func (t *tracingExec) FindInPath(plugin string, paths []string) (string, error) {
	return t.raw.FindInPath(plugin, paths)
}

func (t *tracingExec) Decode(b []byte) (version.PluginInfo, error) {
	return t.decoder.Decode(b)
}

func (t *tracingExec) write(path string) error {
	if path == "" {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	recs := t.records
	if recs == nil {
		recs = []execRecord{}
	}
	b, err := json.Marshal(recs)
	if err != nil {
		return fmt.Errorf("encoding the trace: %w", err)
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		return fmt.Errorf("writing the trace: %w", err)
	}
	return nil
}

// cniEnv is the CNI_* part of a plugin's environment: what the runtime
// tells the plugin besides stdin.
func cniEnv(environ []string) map[string]string {
	m := map[string]string{}
	for _, kv := range environ {
		if k, v, ok := strings.Cut(kv, "="); ok && strings.HasPrefix(k, "CNI_") {
			m[k] = v
		}
	}
	return m
}

func envValue(environ []string, key string) string {
	for _, kv := range environ {
		if k, v, ok := strings.Cut(kv, "="); ok && k == key {
			return v
		}
	}
	return ""
}
