// Command etcd is the etcd server at the version the Kubernetes release of this module uses,
// built from go.etcd.io/etcd/server/v3 (Debian's etcd is older than kube-apiserver supports).
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
