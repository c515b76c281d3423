//! (later issue)
