//! Endpoints and child routers survive a router restart by reconnecting.

mod common;

use std::time::Duration;

use common::{endpoint, recv_n, router_config, tag, untag, wait_until};
use psl_fabric::{Fabric, Router, RouterConfig};

#[test]
fn endpoints_reconnect_after_router_restart() {
    let r = Router::spawn(router_config(None)).unwrap();
    let addr = r.local_addr();
    let a = endpoint(addr, "a");
    let b = endpoint(addr, "b");
    wait_until(Duration::from_secs(5), "both links registered", || r.stats().children() == 2);
    a.publish(tag(0, 0, 8)).unwrap();
    assert_eq!(recv_n(&b, 1, Duration::from_secs(5)).len(), 1);

    r.shutdown();
    wait_until(Duration::from_secs(5), "both endpoints see the router gone", || !a.is_connected() && !b.is_connected());
    // Published while disconnected: dropped and counted, not an error.
    a.publish(tag(0, 1, 8)).unwrap();
    assert_eq!(a.stats().dropped_disconnected, 1);

    let r2 = Router::spawn(RouterConfig { listen: addr, ..router_config(None) }).unwrap();
    assert!(a.wait_connected(Duration::from_secs(5)) && b.wait_connected(Duration::from_secs(5)));
    wait_until(Duration::from_secs(5), "both links registered again", || r2.stats().children() == 2);
    a.publish(tag(0, 2, 8)).unwrap();
    b.publish(tag(1, 0, 8)).unwrap();
    let at_b = recv_n(&b, 1, Duration::from_secs(5));
    let at_a = recv_n(&a, 1, Duration::from_secs(5));
    assert_eq!(at_b.iter().map(|m| untag(m)).collect::<Vec<_>>(), [(0, 2)]);
    assert_eq!(at_a.iter().map(|m| untag(m)).collect::<Vec<_>>(), [(1, 0)]);
    assert_eq!(a.stats().connects, 2);
    assert_eq!(b.stats().connects, 2);
}

#[test]
fn child_router_reconnects_to_restarted_parent() {
    let root = Router::spawn(router_config(None)).unwrap();
    let root_addr = root.local_addr();
    let child = Router::spawn(router_config(Some(root_addr))).unwrap();
    let on_child = endpoint(child.local_addr(), "on-child");
    wait_until(Duration::from_secs(5), "child connected to root", || child.stats().parent_connected());

    root.shutdown();
    wait_until(Duration::from_secs(5), "child sees its parent gone", || !child.stats().parent_connected());
    let root2 = Router::spawn(RouterConfig { listen: root_addr, ..router_config(None) }).unwrap();
    let on_root = endpoint(root2.local_addr(), "on-root");
    wait_until(Duration::from_secs(5), "child reconnected to the new root", || {
        child.stats().parent_connected() && root2.stats().children() == 2
    });
    assert!(child.stats().parent_connects >= 2);
    on_root.publish(tag(0, 0, 8)).unwrap();
    on_child.publish(tag(1, 0, 8)).unwrap();
    assert_eq!(recv_n(&on_child, 1, Duration::from_secs(5)).iter().map(|m| untag(m)).collect::<Vec<_>>(), [(0, 0)]);
    assert_eq!(recv_n(&on_root, 1, Duration::from_secs(5)).iter().map(|m| untag(m)).collect::<Vec<_>>(), [(1, 0)]);
}

#[test]
fn connect_to_nothing_fails_fast_and_names_the_address() {
    // Bind then drop a listener so the port is (very likely) closed.
    let addr = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let e = psl_fabric::TcpEndpoint::connect(addr, common::tcp_config("lonely")).err().expect("refused");
    let text = e.to_string();
    assert!(text.contains("lonely") && text.contains(&addr.to_string()), "{text}");
}
