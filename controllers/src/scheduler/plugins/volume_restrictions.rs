//! (being written: see the scheduler issue)
