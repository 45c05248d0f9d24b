package dispatcher

// SecretsHold is how long a dispatcher keeps a Secret it read (for the idle-memory benchmark).
const SecretsHold = secretsHold
