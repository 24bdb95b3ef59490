//! The software NIC. (Being written.)
