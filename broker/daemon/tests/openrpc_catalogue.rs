//! docs/openrpc.json describes every method the broker answers: the broker's method table
//! (`abx_broker::compose::all_methods`: the core's and the daemon's) and the provider methods it routes.

use abx_protocol::features::PROVIDER_METHODS;
use abx_protocol::openrpc;

#[test]
fn every_broker_method_is_in_the_openrpc_document() {
    let described = openrpc::method_names();
    let answered = abx_broker::compose::all_methods();
    for m in answered.iter().chain(PROVIDER_METHODS) {
        assert!(
            described.contains(m),
            "'{m}' is answered by the broker but missing from protocol/src/openrpc.rs; add it \
             there (types in protocol/src/api/), then regenerate docs/openrpc.json with \
             ABX_UPDATE_OPENRPC=1 cargo test -p abx-protocol --features schema --test openrpc"
        );
    }
    // And nothing described is unknown to the broker (client notifications aside).
    for m in &described {
        let notification = ["initialized", "exit", "$/cancelRequest"].contains(m);
        assert!(
            notification || answered.contains(m) || PROVIDER_METHODS.contains(m),
            "'{m}' is described but the broker does not answer it"
        );
    }
}
