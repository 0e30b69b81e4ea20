// Prints kubeadm's own CoreDNS add-on (cmd/kubeadm/app/phases/addons/dns/manifests.go of
// the k8s.io/kubernetes module in go.mod: its ServiceAccount, ClusterRole and binding,
// Corefile, Deployment and kube-dns Service) rendered as `kubeadm init` renders it, for
// the real node of tests/cluster (node.sh applies it). Its one argument is the module's
// folder; the image is kubeadm's name for the CoreDNS version it pins, which must be the
// version ../coredns builds.
//
//	go run ./kubeadm-dns "$(go list -m -f '{{.Dir}}' k8s.io/kubernetes)" v1.14.6
package main

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"text/template"
)

// Go's string and integer constants of a file, by name (an integer as written).
func consts(path string) (map[string]string, error) {
	f, err := parser.ParseFile(token.NewFileSet(), path, nil, 0)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != token.CONST {
			continue
		}
		for _, s := range g.Specs {
			v := s.(*ast.ValueSpec)
			for i, name := range v.Names {
				if i >= len(v.Values) {
					continue
				}
				lit, ok := v.Values[i].(*ast.BasicLit)
				switch {
				case !ok:
				case lit.Kind == token.STRING:
					if text, err := strconv.Unquote(lit.Value); err == nil {
						out[name.Name] = text
					}
				case lit.Kind == token.INT:
					out[name.Name] = lit.Value
				}
			}
		}
	}
	return out, nil
}

func run(k8s, built string) error {
	constants, err := consts(filepath.Join(k8s, "cmd/kubeadm/app/constants/constants.go"))
	if err != nil {
		return err
	}
	version := constants["CoreDNSVersion"]
	if version != built {
		return fmt.Errorf("kubeadm pins CoreDNS %q, tests/coredns builds %q", version, built)
	}
	dir := filepath.Join(k8s, "cmd/kubeadm/app/phases/addons/dns")
	manifests, err := consts(filepath.Join(dir, "manifests.go"))
	if err != nil {
		return err
	}
	dns, err := consts(filepath.Join(dir, "dns.go"))
	if err != nil {
		return err
	}
	replicas, err := strconv.Atoi(dns["coreDNSReplicas"])
	if err != nil {
		return fmt.Errorf("kubeadm's coreDNSReplicas: %w", err)
	}
	// What kubeadm's dns.go gives its templates at `kubeadm init` (its own constants),
	// with the cluster's DNS address and domain as node.sh sets them for the kubelet.
	data := map[string]any{
		"DeploymentName":       constants["CoreDNSDeploymentName"],
		"Replicas":             replicas,
		"Image":                "registry.k8s.io/coredns/coredns:" + version,
		"ControlPlaneTaintKey": constants["LabelNodeRoleControlPlane"],
		"DNSDomain":            "cluster.local",
		"DNSIP":                "10.96.0.10",
	}
	for k, v := range data {
		if v == "" {
			return fmt.Errorf("no %s in kubeadm's constants", k)
		}
	}
	names := []string{"CoreDNSServiceAccount", "CoreDNSClusterRole", "CoreDNSClusterRoleBinding",
		"CoreDNSConfigMap", "CoreDNSDeployment", "CoreDNSService"}
	// A manifest kubeadm adds later is not dropped silently.
	for name := range manifests {
		if strings.HasPrefix(name, "CoreDNS") && !slices.Contains(names, name) {
			return fmt.Errorf("kubeadm's manifests.go has %s, which this does not render", name)
		}
	}
	for _, name := range names {
		text, ok := manifests[name]
		if !ok {
			return fmt.Errorf("no %s in kubeadm's manifests.go", name)
		}
		t, err := template.New(name).Option("missingkey=error").Parse(text)
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		var b strings.Builder
		if err := t.Execute(&b, data); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		fmt.Printf("---\n%s\n", strings.TrimSpace(b.String()))
	}
	return nil
}

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: kubeadm-dns K8S_MODULE_DIR COREDNS_VERSION")
		os.Exit(2)
	}
	if err := run(os.Args[1], os.Args[2]); err != nil {
		fmt.Fprintln(os.Stderr, "kubeadm-dns:", err)
		os.Exit(1)
	}
}
