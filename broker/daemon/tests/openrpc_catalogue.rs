//! The daemon answers exactly the methods of the catalogue (`abx_protocol::catalogue`), the
//! list docs/openrpc.json and the params check are derived from: its method table
//! (`abx_broker::compose::all_methods`: the core's and the daemon's) and the provider methods
//! it routes.

use abx_protocol::catalogue;
use abx_protocol::features::PROVIDER_METHODS;
use abx_protocol::openrpc;

#[test]
fn the_daemon_answers_the_catalogues_requests() {
    let mut answered = abx_broker::compose::all_methods();
    answered.extend(PROVIDER_METHODS);
    answered.sort_unstable();
    let mut requests = catalogue::REQUESTS.to_vec();
    requests.sort_unstable();
    assert_eq!(
        answered, requests,
        "the daemon's methods vs abx_protocol::catalogue: a new method is one entry in \
         protocol/src/catalogue.rs (and its handler)"
    );
    assert_eq!(abx_broker::compose::METHODS, catalogue::DAEMON);
    // With the daemon's methods, initialize lists every request, in the catalogue's order.
    assert_eq!(
        catalogue::listed(abx_broker::compose::METHODS),
        catalogue::REQUESTS
    );
}

/// docs/openrpc.json describes every method the broker answers, and nothing else (client
/// notifications aside).
#[test]
fn every_broker_method_is_in_the_openrpc_document() {
    let described = openrpc::method_names();
    let answered = abx_broker::compose::all_methods();
    for m in answered.iter().chain(PROVIDER_METHODS) {
        assert!(described.contains(m), "'{m}' is not in docs/openrpc.json");
    }
    for m in &described {
        let notification = !catalogue::method(m).expect("in the catalogue").is_request();
        assert!(
            notification || answered.contains(m) || PROVIDER_METHODS.contains(m),
            "'{m}' is described but the broker does not answer it"
        );
    }
}

/// Every method the broker answers has a params entry (`abx_protocol::api::params`), which
/// its members are checked against (issue 41): a method without one would take any member.
#[test]
fn every_broker_method_checks_its_params_members() {
    let answered = abx_broker::compose::all_methods();
    for m in answered.iter().chain(PROVIDER_METHODS) {
        assert!(
            abx_protocol::api::params::params_of(m).is_some(),
            "'{m}' is answered by the broker but has no params entry"
        );
    }
}
