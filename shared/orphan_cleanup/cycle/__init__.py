"""The steps of a cycle (lister, classifier, deleter, cycle_state, a manual run): they read
facts through the ports (ledger, providers, queues), ask ``core`` for every decision and
hand the decisions back to the ledger."""
