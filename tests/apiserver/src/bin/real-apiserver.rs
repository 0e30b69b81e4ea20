//! The real kube-apiserver and etcd (`tests/kube/build.sh`), started on loopback for a
//! demo or a hand test: prints its URL and an admin kubeconfig, then serves until killed.
//!
//! ```text
//! tests/kube/build.sh && cargo run -p test-apiserver --bin real-apiserver
//! KUBECONFIG=/tmp/real-apiserver-XXXX/admin.kubeconfig kubectl get configmaps -A
//! ```

use test_apiserver::real::{self, RealApiserver};

fn main() {
    if !real::built() {
        eprintln!(
            "real-apiserver: not built in '{}': run tests/kube/build.sh first",
            real::bin_dir().display()
        );
        std::process::exit(2);
    }
    let extra: Vec<String> = std::env::args().skip(1).collect();
    let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
    let k = RealApiserver::start_with(&extra);
    println!("url: {}", k.url);
    println!("kubeconfig: {}", k.admin_kubeconfig().display());
    println!("ca: {}", k.ca_file().display());
    println!("etcd: {}", k.etcd_url);
    println!("logs: {}", k.dir().display());
    println!("kubectl: {}", real::bin_dir().join("kubectl").display());
    loop {
        std::thread::park();
    }
}
