package lease

// JournalFindSQL is the statement a decision queues to read the journal
// (QueueJournalFind), for tests that EXPLAIN it.
var JournalFindSQL = leaseAdmissionsFindSQL
