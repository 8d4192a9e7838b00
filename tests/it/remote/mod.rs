//! Loops whose state lives in their repository (DESIGN §16), driven through real remotes
//! (`file://`, `git daemon`, `git http-backend`), real clones and real `loopflow run`
//! processes racing: exactly one tick per slot, faults that lose nothing of record,
//! humans from any clone, credentials that never reach an agent.

mod credentials;
mod faults;
mod humans;
mod race;
mod schedulers;
