#!/usr/bin/env python3
"""Submit a turn in the same transaction as the application's own data (turnwatch SQL API, docs/operations.md).

An application that records, say, a support ticket and wants an agent to work on it calls tw.submit_turn in the
transaction that inserts the ticket: both exist, or neither does. No NATS is needed on this side: at commit the
PMO hears of the turn through LISTEN/NOTIFY and dispatches it.

    submit_in_transaction.py [--dsn DSN] [--agent A] [--profile P] [--rollback] TEXT

Prints the turn id (and the ticket id). With --rollback the transaction is rolled back after the submit, to
show that then there is no ticket and no turn. Needs Debian's python3-psycopg.
"""
import argparse
import sys

import psycopg
from psycopg.types.json import Jsonb


class Rollback(Exception):
    pass


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dsn", default="postgresql:///turnwatch")
    ap.add_argument("--agent", default="echo", help="an agent of the roster, or a profile's own agent")
    ap.add_argument("--profile", help="add the agent bound to this profile if it does not exist")
    ap.add_argument("--rollback", action="store_true", help="roll the transaction back after the submit")
    ap.add_argument("text")
    args = ap.parse_args()

    with psycopg.connect(args.dsn) as conn:
        try:
            with conn.transaction():
                # The application's own table and row (created here only to keep the example self-contained).
                conn.execute("CREATE TABLE IF NOT EXISTS example_tickets ("
                             " id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, text text NOT NULL,"
                             " turn_id uuid, created_at timestamptz NOT NULL DEFAULT now())")
                ticket = conn.execute("INSERT INTO example_tickets (text) VALUES (%s) RETURNING id",
                                      (args.text,)).fetchone()[0]
                # Parameters by name, as the contract allows; the idempotency key makes a retried
                # transaction give the same turn.
                turn = conn.execute(
                    "SELECT tw.submit_turn(agent => %s, channel => %s, input => %s, timeout_seconds => 600,"
                    " idempotency_key => %s, profile => %s)",
                    (args.agent, f"ticket-{ticket}", Jsonb({"ticket": ticket, "text": args.text}),
                     f"ticket-{ticket}", args.profile)).fetchone()[0]
                conn.execute("UPDATE example_tickets SET turn_id = %s WHERE id = %s", (turn, ticket))
                if args.rollback:
                    print(f"rolling back ticket {ticket} and turn {turn}", file=sys.stderr)
                    raise Rollback()
        except Rollback:
            return 0
        except psycopg.errors.InvalidParameterValue as e:  # SQLSTATE 22023: bad input, in words
            print(f"submit_in_transaction: {e.diag.message_primary}", file=sys.stderr)
            return 2
    print(f"{turn} ticket={ticket}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
