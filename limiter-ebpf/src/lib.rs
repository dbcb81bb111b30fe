//! Empty on purpose: the daemon build-depends on this crate so cargo
//! rebuilds the kernel programs (the `limiter` binary target, built for
//! `bpfel-unknown-none` by `aya-build`) whenever they change.
#![no_std]
