"""Starts the sptr perception node (executable `perception_node` of package `sptr`).

    ros2 launch sptr perception.launch.py weights:=/path/model.safetensors device:=cuda \
        input_points:=/sensing/lidar/concatenated/pointcloud

Arguments: params_file (default: the installed config/perception.yaml), weights (safetensors;
required unless the params file sets model.weights), device (cuda | cpu | auto), namespace,
use_sim_time, input_points (remap of ~/input/points); for the camera branch camera_model (BEV
map model YAML), camera_weights (its safetensors, or random:<seed> for untrained weights) and cameras (camera names, e.g.
"[CAM_FRONT, CAM_BACK]"); an empty value keeps the params file's; rviz (default false): true also
starts rviz2 with the installed config/rviz/sptr.rviz, whose topics are the default node name and
namespace's (/sptr/output/...). The six-camera nuScenes rig:

    ros2 launch sptr perception.launch.py \
        params_file:=$(ros2 pkg prefix sptr)/share/sptr/config/perception_nuscenes_cameras.yaml \
        weights:=/path/sphereformer.safetensors camera_weights:=/path/bevfusion_seg.safetensors

The executable gets:

    perception_node --ros-args -r __node:=sptr [-r __ns:=<namespace>] \
        --params-file <params_file> --params-file <temporary file of the overrides> \
        -r ~/input/points:=<input_points>

and with rviz:=true, beside it: rviz2 -d <share>/config/rviz/sptr.rviz
"""

import os

from ament_index_python.packages import get_package_share_directory
from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, OpaqueFunction
from launch.conditions import IfCondition
from launch.substitutions import LaunchConfiguration
from launch_ros.actions import Node
from launch_ros.parameter_descriptions import ParameterValue


def _node(context):
    # Only arguments the user gave override the params file: an empty `weights` keeps its value.
    overrides = {
        "device": LaunchConfiguration("device").perform(context),
        "use_sim_time": LaunchConfiguration("use_sim_time").perform(context).lower() == "true",
    }
    # Paths absolute: launch_ros writes these overrides to a temporary params file, and the node
    # resolves a relative path against the directory of the file that sets it.
    for arg, param in [("weights", "model.weights"), ("camera_model", "camera.model_config"),
                       ("camera_weights", "camera.model_weights")]:
        value = LaunchConfiguration(arg).perform(context)
        if value:
            overrides[param] = os.path.abspath(os.path.expanduser(value))
    cameras = LaunchConfiguration("cameras").perform(context).strip()
    if cameras:
        names = [c.strip() for c in cameras.strip("[]").replace(",", " ").split()]
        overrides["input.cameras"] = names
    return [
        Node(
            package="sptr",
            executable="perception_node",
            name="sptr",
            namespace=LaunchConfiguration("namespace"),
            output="screen",
            parameters=[LaunchConfiguration("params_file"), overrides],
            remappings=[("~/input/points", LaunchConfiguration("input_points"))],
        )
    ]


def generate_launch_description():
    share = get_package_share_directory("sptr")
    default_params = os.path.join(share, "config", "perception.yaml")
    args = [
        DeclareLaunchArgument("params_file", default_value=default_params,
                              description="ROS 2 params file of the node"),
        DeclareLaunchArgument("weights", default_value="",
                              description="safetensors weights; empty keeps the params file's value"),
        DeclareLaunchArgument("device", default_value="cuda", description="cuda, cpu or auto"),
        DeclareLaunchArgument("namespace", default_value="", description="node namespace"),
        DeclareLaunchArgument("use_sim_time", default_value="false"),
        DeclareLaunchArgument("input_points", default_value="~/input/points",
                              description="LiDAR PointCloud2 topic"),
        DeclareLaunchArgument("camera_model", default_value="",
                              description="BEV map model YAML; empty keeps the params file's"),
        DeclareLaunchArgument("camera_weights", default_value="",
                              description="BEV map model safetensors, or random:<seed>; empty keeps the params file's"),
        DeclareLaunchArgument("cameras", default_value="",
                              description="camera names, e.g. [CAM_FRONT, CAM_BACK]; empty keeps the params file's"),
        DeclareLaunchArgument("rviz", default_value="false",
                              description="true: also start rviz2 with config/rviz/sptr.rviz"),
    ]
    # The config names the default launch's topics (/sptr/output/...): with a namespace, the
    # displays' topics need it too (docs/node.md, "Seeing the outputs").
    rviz = Node(
        package="rviz2",
        executable="rviz2",
        name="rviz2",
        output="screen",
        arguments=["-d", os.path.join(share, "config", "rviz", "sptr.rviz")],
        parameters=[{"use_sim_time": ParameterValue(LaunchConfiguration("use_sim_time"), value_type=bool)}],
        condition=IfCondition(LaunchConfiguration("rviz")),
    )
    return LaunchDescription(args + [OpaqueFunction(function=_node), rviz])
