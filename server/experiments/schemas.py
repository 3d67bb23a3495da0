"""An experiment's fields as the API takes and shows them: what an organizer may set (validated against the
task), the partial edit, the public view, and the training configuration workers get."""

from __future__ import annotations

from datetime import datetime
from enum import Enum
from typing import Any, Optional

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    create_model,
    field_validator,
    model_validator,
)

from swarmhub.common.proposal import SettingsProposal, swarm_rate_cap, unthrottled_batch
from swarmhub.common.protocol import SLUG_RE, ExperimentConfig, ExperimentStatus, ExperimentSummary, TrainingSettings
from swarmhub.server.accounts.users import USERNAME_RE
from swarmhub.server.core.security import StoredText
from swarmhub.server.models import Experiment
from swarmhub.worker.tasks import UnknownTask, get_task

TRAINING_FIELDS = tuple(TrainingSettings.model_fields)
DEFAULT_MAX_PEERS_PER_VOLUNTEER = 4


def _check_task_params(task: str, params: dict[str, Any]) -> dict[str, Any]:
    try:
        return get_task(task).Params.model_validate(params).model_dump()
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "task_params"
        raise ValueError(f"{where}: {first['msg']}") from None


class JoinPolicy(str, Enum):
    open = "open"  # anyone signed in
    invite = "invite"  # volunteers who opened the experiment's invite link
    allowlist = "allowlist"  # the usernames listed by the organizer


class ExperimentFields(TrainingSettings):
    title: StoredText = Field(min_length=1, max_length=120)
    description: StoredText = Field(default="", max_length=5000)
    task_params: dict[str, Any] = Field(default_factory=dict, validate_default=True)
    join_policy: JoinPolicy = JoinPolicy.open
    allowlist: list[str] = Field(default_factory=list, max_length=10_000)
    aux_peer: bool = Field(
        default=True,
        description="The server runs an auxiliary peer that helps average (no gradients of its own) and witnesses "
        "every averaging round: only rounds it witnessed count as verified work",
    )
    checkpoint_minutes: float = Field(
        default=10.0,
        ge=0.1,
        le=10_080,
        description="How often the server saves the swarm's model and measures its held-out loss "
        "(tasks that keep checkpoints)",
    )
    max_peers_per_volunteer: int = Field(
        default=DEFAULT_MAX_PEERS_PER_VOLUNTEER,
        ge=1,
        le=64,
        description="How many peers one volunteer may run in the swarm at once: peer keys with a valid swarm token",
    )
    auto_remove_flags: int = Field(
        default=0,
        ge=0,
        le=1_000_000,
        description="Remove a volunteer once the server's peers flagged their peers this many times (non-finite "
        "gradients, an epoch ahead of the swarm, a poisoned state); 0: never",
    )

    @field_validator("allowlist", mode="before")
    @classmethod
    def _usernames(cls, value: Any) -> Any:
        if isinstance(value, str):  # the form's textarea: names separated by spaces, commas or lines
            value = [name for name in value.replace(",", " ").split() if name]
        if isinstance(value, list):
            for name in value:
                if not isinstance(name, str) or not USERNAME_RE.match(name):
                    raise ValueError(f"{name!r} is not a username")
            return sorted(set(value))
        return value

    @field_validator("title")
    @classmethod
    def _strip(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("title must not be blank")
        return value.strip()

    @field_validator("task")
    @classmethod
    def _known_task(cls, value: str) -> str:
        try:
            get_task(value)
        except UnknownTask as exc:
            raise ValueError(str(exc)) from None
        return value

    @field_validator("task_params")
    @classmethod
    def _task_params(cls, value: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        if "task" not in info.data:
            return value  # the task itself is wrong; that error names the field
        return _check_task_params(info.data["task"], value)


PROPOSED_FIELDS = ("target_batch_size", "matchmaking_time", "averaging_timeout")
# What a task may also propose (``Task.proposed_optimizer``): taken where the task proposes it and the organizer set
# neither (a learning rate belongs to its optimizer and the target batch size).
PROPOSED_TRAINING = ("optimizer", "learning_rate")


def proposal_for(task: str, task_params: dict[str, Any]) -> SettingsProposal | None:
    """The task's proposed settings for these parameters, for the default planned swarm (None for a task that is
    not installed here, or whose parameters its installed version no longer takes)."""
    try:
        return get_task(task)(task_params).proposal()
    except (UnknownTask, ValidationError):
        return None


def proposed_training(task: str, task_params: dict[str, Any], target_batch_size: int) -> tuple[Any, float] | None:
    """The optimizer and learning rate the task proposes for this target batch size (``Task.proposed_optimizer``),
    or None where it proposes none."""
    try:
        instance = get_task(task)(task_params)
    except (UnknownTask, ValidationError):
        return None
    rate = instance.proposed_learning_rate(target_batch_size)
    if instance.proposed_optimizer is None or rate is None:
        return None
    return instance.proposed_optimizer, rate


class ExperimentCreate(ExperimentFields):
    slug: str = Field(min_length=3, max_length=50, description="lowercase letters, digits and '-'")

    @model_validator(mode="after")
    def _task_proposal(self) -> ExperimentCreate:
        """An experiment created without a target batch size or timings gets its task's proposal for them
        (``Task.proposal``: a swarm of ``DEFAULT_PLANNED_PEERS`` reference peers trains unthrottled), not the plain
        defaults, which cap a swarm far below what one peer computes on a small task; one created without an
        optimizer and learning rate gets those the task proposes (ALBERT: LAMB at a rate for the proposed batch)."""
        unset = [name for name in PROPOSED_FIELDS if name not in self.model_fields_set]
        proposal = proposal_for(self.task, self.task_params) if unset else None
        if proposal is not None:
            for name in unset:
                setattr(self, name, getattr(proposal, name))
        if not any(name in self.model_fields_set for name in PROPOSED_TRAINING):
            # for the target batch size the experiment has, the organizer's own or the proposed one
            proposed = proposed_training(self.task, self.task_params, self.target_batch_size)
            if proposed is not None:
                self.optimizer, self.learning_rate = proposed
        return self

    @field_validator("slug")
    @classmethod
    def _slug(cls, value: str) -> str:
        if not SLUG_RE.match(value):
            raise ValueError("use 3-50 lowercase letters, digits and '-', not starting or ending with '-'")
        return value


def _optional_fields() -> dict[str, Any]:
    """Every field an organizer sets (``ExperimentFields``), each optional and unset by default: the partial edit
    takes the same settings as creation without listing them again."""
    fields: dict[str, Any] = {
        name: (Optional[field.annotation], None)  # noqa: UP045 - an annotation object, not a written type
        for name, field in ExperimentFields.model_fields.items()
    }
    fields["allowlist"] = (list[str] | str | None, None)  # the form's textarea sends one string
    return fields


_UpdateFields: type[BaseModel] = create_model(
    "ExperimentUpdateFields", __config__=ConfigDict(extra="forbid"), **_optional_fields()
)


class ExperimentUpdate(_UpdateFields):  # type: ignore[misc, valid-type]
    """A partial edit. Bounds are checked once, on the merged result, by ``ExperimentFields``."""


class SettingWarning(BaseModel):
    field: str
    message: str


def setting_warnings(
    experiment: Experiment, proposal: SettingsProposal | None, fastest_peer_rate: float
) -> list[SettingWarning]:
    """What the organizer is told when the settings cap the swarm below one peer: the task's reference peer (known
    before anyone joins) or the fastest peer of this experiment (its signed progress records)."""
    target, matchmaking = experiment.target_batch_size, experiment.matchmaking_time
    cap = swarm_rate_cap(target, matchmaking)
    found = []
    if proposal is not None and cap < proposal.reference_samples_per_second:
        rate = proposal.reference_samples_per_second
        found.append(
            SettingWarning(
                field="target_batch_size",
                message=f"caps the whole swarm at {cap:,.0f} samples/s, below the {rate:,.0f} samples/s that one "
                f"reference peer (one CPU thread) trains on this task: the swarm would wait instead of training. "
                f"Raise it to at least {unthrottled_batch(rate, matchmaking):,} (the task proposes "
                f"{proposal.target_batch_size:,} for {proposal.planned_peers} such peers)",
            )
        )
    if fastest_peer_rate > cap:
        found.append(
            SettingWarning(
                field="target_batch_size",
                message=f"caps the whole swarm at {cap:,.0f} samples/s, below the {fastest_peer_rate:,.0f} samples/s "
                f"one peer of this experiment alone has trained: raise it to at least "
                f"{unthrottled_batch(fastest_peer_rate, matchmaking):,}",
            )
        )
    return found


class ExperimentPublic(ExperimentSummary, TrainingSettings):
    """An experiment as ``GET /api/experiments/{slug}`` shows it: its summary, its training settings (one
    definition, ``TrainingSettings``) and the organizer's other settings."""

    model_config = ConfigDict(extra="ignore")

    aux_peer: bool
    checkpoint_minutes: float
    max_peers_per_volunteer: int
    auto_remove_flags: int
    join_policy: JoinPolicy
    updated_at: datetime
    max_swarm_samples_per_second: float = Field(
        description="The most samples/s the whole swarm can train at with these settings: each peer waits at least "
        "matchmaking_time between optimizer steps, so the swarm gathers at most target_batch_size samples per "
        "matchmaking_time. Set it above the swarm's hardware, or it waits instead of training."
    )
    proposal: SettingsProposal | None = Field(
        description="The task's proposed target batch size and timings for these task parameters (a swarm of "
        "planned_peers reference peers trains unthrottled); null for a task without a reference rate"
    )
    warnings: list[SettingWarning] = Field(
        default_factory=list,
        description="Settings that hold the swarm back: the rate cap below what one reference peer trains on this "
        "task, or below the fastest rate a peer of this experiment has signed",
    )


class StatusChange(BaseModel):
    action: str = Field(pattern="^(start|pause|finish)$")


def to_public(experiment: Experiment, fastest_peer_rate: float = 0.0) -> ExperimentPublic:
    """The API's view of an experiment; ``fastest_peer_rate`` (the highest rate its peers have signed) adds the
    warning when the settings hold that peer back."""
    proposal = proposal_for(experiment.task, experiment.task_params)
    return ExperimentPublic(
        slug=experiment.slug,
        title=experiment.title,
        description=experiment.description,
        status=ExperimentStatus(experiment.status),
        owner=experiment.owner.username,
        **{name: getattr(experiment, name) for name in TRAINING_FIELDS},
        aux_peer=experiment.aux_peer,
        checkpoint_minutes=experiment.checkpoint_minutes,
        max_peers_per_volunteer=experiment.max_peers_per_volunteer,
        auto_remove_flags=experiment.auto_remove_flags,
        join_policy=JoinPolicy(experiment.join_policy),
        max_swarm_samples_per_second=swarm_rate_cap(experiment.target_batch_size, experiment.matchmaking_time),
        proposal=proposal,
        warnings=setting_warnings(experiment, proposal, fastest_peer_rate),
        created_at=experiment.created_at,
        updated_at=experiment.updated_at,
    )


def to_config(experiment: Experiment) -> ExperimentConfig:
    return ExperimentConfig(
        slug=experiment.slug,
        title=experiment.title,
        **{name: getattr(experiment, name) for name in TRAINING_FIELDS},
    )
