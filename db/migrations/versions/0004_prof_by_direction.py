"""Per-direction profile: `profiles.by_direction` (JSON, nullable), a training step's collective counts, bytes and
host syncs of its forward and of its backward (`runners.profile`); NULL for forward points and older profiles.

Revision ID: 0004_prof
Revises: 0003_dash
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004_prof"
down_revision: str | None = "0003_dash"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("profiles") as batch:
        batch.add_column(sa.Column("by_direction", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("profiles") as batch:
        batch.drop_column("by_direction")
