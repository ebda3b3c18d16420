//! Harness for the end-to-end tests in `tests/`: throwaway nodes built from
//! network namespaces, conf dirs and bin dirs, driven through libcni.
